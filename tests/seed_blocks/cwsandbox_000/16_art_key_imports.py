import art
from art.local import LocalBackend
from art.tinker import TinkerBackend
# Create trainable model
model = art.TrainableModel(
    name="train-001",
    project="cwsandbox-mbpp",
    base_model="Qwen/Qwen3-8B",
)
# Collect trajectories
groups = await art.gather_trajectory_groups(
    (collect_trajectories(problem) for problem in problems),
    pbar_desc="collecting",
)
# Train
result = await backend.train(model, groups, learning_rate=1e-5)
