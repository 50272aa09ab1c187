sandbox = session.sandbox()
result = sandbox.exec(["echo", "hello"]).result()
print(sandbox.exec_stats) # {"exec_count": 1, "completed_ok": 1, "completed_nonzero": 0, "failures": 0}
