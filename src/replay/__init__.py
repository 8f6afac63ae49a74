"""Off-policy rollouts: the replay buffer, the Ray rollout workers that fill it, and the rollout
pipeline's buffers built on them (a layer above ``rollout``)."""
