sandbox = session.sandbox()
result = sandbox.exec(["echo", "hello"]).result()
print(sandbox.execution_stats)  # {"total": 1, "successes": 1, "failures": 0, "errors": 0}
