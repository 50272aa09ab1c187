session.log_metrics(step=step, reset=False)  # Keep accumulating
