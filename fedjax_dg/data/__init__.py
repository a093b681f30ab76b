"""Datasets, splits, partitions and the packed client store."""
from fedjax_dg.data.datasets import DomainDataset, load_dataset
from fedjax_dg.data.splits import Fold, Split, make_fold, leave_one_domain_out
from fedjax_dg.data.store import ClientStore, pack_clients
from fedjax_dg.data import partition
