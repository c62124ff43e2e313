"""DLU elastic training: ElasticMaster and ElasticWorker for torch.distributed."""

__version__ = "0.1.0"
