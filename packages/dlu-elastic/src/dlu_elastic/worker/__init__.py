"""ElasticWorker actor and the training processes it forks."""
