"""Does a driver's dlu-api work with this dlu-prime? Asked before a remote job starts.

The answer is the range this dlu-prime declares for dlu-api in its own metadata (for example
`dlu-api>=0.1.0,<0.2`): the same range pip enforces when both are installed together, so a
driver and a cluster agree exactly when one environment holding both would be allowed.
"""

from __future__ import annotations

import logging
from importlib.metadata import PackageNotFoundError, requires, version

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

from dlu_api.client.wire import major_minor

logger = logging.getLogger(__name__)


def installed_version(distribution: str) -> str:
    try:
        return version(distribution)
    except PackageNotFoundError:
        return "0+unknown"


def api_requirement() -> Requirement | None:
    """This dlu-prime's requirement on dlu-api, from its installed metadata."""
    try:
        declared = requires("dlu-prime") or []
    except PackageNotFoundError:
        return None
    for text in declared:
        try:
            requirement = Requirement(text)
        except InvalidRequirement:
            continue
        if requirement.name == "dlu-api" and requirement.marker is None:
            return requirement
    return None


def api_version_problem(driver_api_version: str) -> str | None:
    """Why a driver with dlu-api `driver_api_version` cannot use this cluster; None if it can."""
    prime = installed_version("dlu-prime")
    requirement = api_requirement()
    if requirement is not None and str(requirement.specifier):
        try:
            ok = requirement.specifier.contains(Version(driver_api_version), prereleases=True)
        except InvalidVersion:
            ok = False
        wanted = f"dlu-api{requirement.specifier}"
    else:  # no metadata (a source tree): the same major.minor as the dlu-api installed here
        local = installed_version("dlu-api")
        ok = major_minor(local) is not None and major_minor(local) == major_minor(driver_api_version)
        wanted = f"dlu-api {local}"
    if ok:
        return None
    return (
        f"the driver's dlu-api {driver_api_version} does not work with this cluster's dlu-prime {prime}, "
        f"which needs {wanted}. Install a matching driver (`pip install '{wanted}'`) "
        "or run a cluster image built from the same release as the driver."
    )
