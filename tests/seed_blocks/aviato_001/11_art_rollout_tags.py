tags=(
    "art-rollout",
    f"job-{job_id}",
    f"problem-{problem.task_id}",
)
