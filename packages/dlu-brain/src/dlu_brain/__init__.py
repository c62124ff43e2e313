"""DLU Brain: cluster mode's service (statistics in a database, plans per job)."""

from dlu_brain.administrator import AdminSettings, JobAdministrator, Trigger
from dlu_brain.db import BrainDatabase, DatabaseUnavailableError
from dlu_brain.optimizer import OptimizerSettings
from dlu_brain.server import BrainServer
from dlu_brain.service import Brain

__all__ = [
    "AdminSettings",
    "Brain",
    "BrainDatabase",
    "BrainServer",
    "DatabaseUnavailableError",
    "JobAdministrator",
    "OptimizerSettings",
    "Trigger",
]
