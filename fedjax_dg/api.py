"""The library's building blocks, each reading what it needs from one config.

`fedjax_dg.train_and_evaluate(config, workdir)` runs a whole experiment. These functions
are its pieces, for a loop of your own (a custom model, a custom round schedule, gradients
through rounds):

    fold = load_fold(config)                      # the data, split by domains
    store = pack(config, fold)                    # partitioned and padded per client
    model = build_model(config.model, fold.train.x.shape[1:], fold.num_classes)
    algorithm = build_method(config, model, store, fold)
    round_fn = make_round(algorithm, store.counts.shape[0], cohort_size(config, ...), "vmap")

The local schedule (batch size, local steps or epochs) comes from `config.client` only, so
the batch size is given once.
"""
from __future__ import annotations

from fedjax_dg import algorithms
from fedjax_dg import config as config_lib
from fedjax_dg import folds as folds_lib
from fedjax_dg import plan as plan_lib
from fedjax_dg.algorithms.base import LocalSchedule, make_schedule
from fedjax_dg.data import splits
from fedjax_dg.data import store as store_lib


def load_fold(config) -> splits.Fold:
  """The fold `config.data` describes: training, validation and test splits by domain (a
  WILDS release: its official splits). Leave-one-domain-out is the runner's loop.

  Args:
    config: the experiment config.

  Returns:
    The `Fold` the runner would train and test on.
  """
  return folds_lib.load_fold(config)


def pack(config, fold: splits.Fold) -> store_lib.ClientStore:
  """The training split partitioned over `config.num_clients` clients (`config.partition`)
  and packed as the padded client store `[C, N_max, ...]` the round reads.

  Args:
    config: the experiment config.
    fold: the data splits (`load_fold`).

  Returns:
    The packed `ClientStore`, as the runner packs it.
  """
  num_clients = plan_lib.num_clients_of(config)
  config_lib.validate_data(config, len(fold.train), num_clients)
  return store_lib.pack_clients(fold.train, plan_lib.partition_clients(config, fold, num_clients))


def local_schedule(config, counts, unroll: int | bool = 1, augment=None) -> LocalSchedule:
  """The clients' local loop from `config.client` (`batch_size`, `local_steps` or
  `local_epochs`) and the clients' example counts.

  Args:
    config: the experiment config.
    counts: the clients' example counts (`store.counts`).
    unroll: `lax.scan`'s `unroll` for the local loop.
    augment: `(rng, x) -> x` applied to every training batch, or None.

  Returns:
    The `LocalSchedule`.
  """
  c = config.client
  n_max, n_min = int(max(counts)), int(min(counts))
  return make_schedule(int(c.batch_size), int(c.local_steps), int(c.local_epochs), n_max, n_min, unroll, augment,
                       activity=bool(config.get("activity", True)))


def local_steps(config, counts) -> int:
  """The compiled local loop's length: `client.local_steps`, or the largest client's epochs.

  Args:
    config: the experiment config.
    counts: the clients' example counts (`store.counts`).

  Returns:
    Local steps per round of the largest client.
  """
  return plan_lib.local_steps(config.client, int(max(counts)))


def build_method(config, model, store: store_lib.ClientStore, fold: splits.Fold | None = None,
                 sched: LocalSchedule | None = None):
  """The engine's `Algorithm` for `config.algorithm.name` (a method, or `method+rule`) with
  its hyperparameters from `config.algorithm.<method>`.

  Building checks the config, and checks the method's client objective once for reading
  the padded rows of a batch (`algorithms.base.check_padding`).

  Args:
    config: the experiment config.
    model: the model the clients train (FedSR expects `algorithms.model_for(config, model)`).
    store: the packed client store (`pack`).
    fold: the data splits; they give the domains (methods that work per domain read
      them). None: every client is one domain.
    sched: the local schedule (default: `local_schedule(config, store.counts)`).

  Returns:
    The `Algorithm`.

  Raises:
    ValueError: one line for a bad config field, an unknown method or rule, a rule the
      method's clients cannot feed, or a client objective whose loss reads padded rows.
  """
  config_lib.validate(config)
  num_clients = int(store.counts.shape[0])
  sched = sched or local_schedule(config, store.counts)
  num_domains = len(fold.domain_names) if fold is not None else 1
  train_domains = fold.train_domains if fold is not None else None
  return algorithms.build_algorithm(config, model, sched, num_clients, config_lib.cohort_size(config, num_clients),
                                    num_domains=num_domains, train_domains=train_domains, store=store)


def cohort_size(config, num_clients: int) -> int:
  """Clients sampled per round: `config.cohort_size`, else `cohort_fraction * num_clients`.

  Args:
    config: the experiment config.
    num_clients: `C`, the clients holding training data.

  Returns:
    The cohort size.
  """
  return config_lib.cohort_size(config, num_clients)
