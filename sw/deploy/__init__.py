"""``mcf deploy``: the overlay and the runtime onto KR260 boards over SSH (issue #12 item 5).

:mod:`.spec` holds the rules and the remote commands (pure), :mod:`.runtime` builds the wheel,
:mod:`.ssh` runs every host concurrently with asyncssh, :mod:`.report` prints the table. The
command line is :mod:`mcf.commands.deploy`; README "Deploy to boards". Needs the ``deploy`` extra
(asyncssh, rich, packaging); the modules import without it, as the board runtime does.
"""

from .spec import (
    BOARD_EXTRA,
    BOARD_PYTHON,
    PROBE,
    DeployError,
    HostResult,
    HostSpec,
    OverlayFiles,
    board_pynq_requirement,
    check_pynq,
    check_python,
    evaluate_probe,
    parse_hosts,
    remote_commands,
)
from .ssh import HAVE_ASYNCSSH, DeployConfig, deploy, deploy_host

__all__ = ["BOARD_PYTHON", "BOARD_EXTRA", "PROBE", "DeployError", "HostResult", "HostSpec",
           "OverlayFiles", "DeployConfig", "HAVE_ASYNCSSH", "deploy", "deploy_host",
           "board_pynq_requirement", "check_pynq", "check_python", "evaluate_probe",
           "parse_hosts", "remote_commands"]
