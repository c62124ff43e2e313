"""Where the actor classes DLU creates live, as import paths: a module that imports nothing, so
that the embedded Ray's worker script can name them without importing pydantic or Ray."""

ELASTIC_SUB_MASTER = "dlu_elastic.master:ElasticMaster"
ELASTIC_WORKER = "dlu_elastic.worker.actor:ElasticWorkerActor"

# What a Ray worker process imports to host any of them (the embedded Ray's workers fork from a
# zygote that imported these first, see dlu_prime.ray_workers).
ACTOR_MODULES: tuple[str, ...] = (
    "dlu_prime.master.actor",
    "dlu_prime.worker.actor",
    "dlu_prime.worker.submaster",
    ELASTIC_WORKER.partition(":")[0],
    ELASTIC_SUB_MASTER.partition(":")[0],
)
