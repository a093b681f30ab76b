"""The round engine: cohort -> client updates (vectorised or otherwise) -> server update."""
from fedjax_dg.engine.round import RoundState, init_round_state, make_round, STRATEGIES, default_strategy
