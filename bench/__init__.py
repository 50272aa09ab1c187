"""asyncsandbox's benchmark harness: the runtime and its peers, measured side by side.

Run ``python -m bench --help``; see ``bench/README.md``. Not collected by pytest.
"""
