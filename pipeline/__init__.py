"""The orchestration layer: the stages strung together (on-policy relabelling and rounds, evaluation, the report) over
the libraries collect, sft, rl, rewards and serve, which never import it. Planner specs have their one home here
(pipeline.planners)."""
