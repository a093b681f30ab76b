"""The round engine: cohort -> client updates (vectorised or otherwise) -> server update."""
from fedjax_dg.engine.round import (RoundState, STRATEGIES, default_strategy, init_round_state,  # noqa: F401
                                    make_round)
