from openai.types.chat import ChatCompletionToolParam
trajectory = art.Trajectory(
    messages_and_choices=messages_and_choices, # Conversation history
    tools=ROLLOUT_TOOLS, # Tool definitions
    reward=1.0 if passed else 0.0, # Binary reward
    metadata={"task_id": problem.task_id},
)
return trajectory.finish()
