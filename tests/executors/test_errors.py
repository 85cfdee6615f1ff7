"""Node errors are typed from exception classes, disconnect codes and exit statuses, never from their text."""

from __future__ import annotations

import copy
import errno
import pickle
import socket

import asyncssh
import pytest
from hsched.executors._rpc import check_reply, network_error, parse_oneshot
from hsched.executors.ssh import _retold, classify, transfer_error

from hsched.errors import (
    ExecutorError,
    HelperError,
    HschedError,
    NodeRefused,
    NodeUnreachable,
    Refusal,
    TransferError,
)

# every message says "host key" and "permission denied": the class must not come from the words
MISLEADING = "host key permission denied authentication"


@pytest.mark.parametrize(("error", "kind", "reason"), [
    (asyncssh.HostKeyNotVerifiable(MISLEADING), NodeRefused, Refusal.HOST_KEY_UNKNOWN),
    (asyncssh.PermissionDenied(MISLEADING), NodeRefused, Refusal.AUTH),
    (asyncssh.IllegalUserName(MISLEADING), NodeRefused, Refusal.AUTH),
    (asyncssh.DisconnectError(asyncssh.DISC_HOST_NOT_ALLOWED_TO_CONNECT, "x"), NodeRefused, Refusal.AUTH),
    (asyncssh.KeyExchangeFailed("no matching algorithm"), NodeRefused, Refusal.INCOMPATIBLE),
    (asyncssh.ProtocolNotSupported("x"), NodeRefused, Refusal.INCOMPATIBLE),
    (asyncssh.ChannelOpenError(asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED, "x"), NodeRefused, Refusal.AUTH),
    (asyncssh.ConnectionLost(MISLEADING), NodeUnreachable, None),
    (asyncssh.DisconnectError(asyncssh.DISC_BY_APPLICATION, MISLEADING), NodeUnreachable, None),
    (asyncssh.DisconnectError(asyncssh.DISC_TOO_MANY_CONNECTIONS, "x"), NodeUnreachable, None),
    (asyncssh.ProtocolError("bad packet"), NodeUnreachable, None),
    (asyncssh.ChannelOpenError(asyncssh.OPEN_RESOURCE_SHORTAGE, MISLEADING), NodeUnreachable, None),
    (ConnectionRefusedError(errno.ECONNREFUSED, MISLEADING), NodeUnreachable, None),
    (ConnectionResetError(errno.ECONNRESET, MISLEADING), NodeUnreachable, None),
    (TimeoutError(MISLEADING), NodeUnreachable, None),
    (socket.gaierror(socket.EAI_NONAME, "Name or service not known"), NodeUnreachable, None),
    (OSError(errno.ENETUNREACH, "Network is unreachable"), NodeUnreachable, None),
    (OSError(errno.EHOSTUNREACH, MISLEADING), NodeUnreachable, None),
    (OSError(errno.ENETDOWN, "Network is down"), NodeUnreachable, None),
    (PermissionError(errno.EACCES, MISLEADING, "/home/u/.ssh/id_ed25519"), NodeRefused, Refusal.CONFIG),
    (FileNotFoundError(errno.ENOENT, "No such file", "/home/u/.ssh/config"), NodeRefused, Refusal.CONFIG),
])
def test_classify(error: asyncssh.Error | OSError, kind: type[ExecutorError], reason: Refusal | None) -> None:
    got = classify(error, "n1: the message stays as given")
    assert type(got) is kind and str(got) == "n1: the message stays as given"
    if reason is not None:
        assert isinstance(got, NodeRefused) and got.reason is reason and not got.retryable
    else:
        assert got.retryable


def test_network_error_of_an_unknown_oserror_is_transient() -> None:
    assert type(network_error(OSError(errno.EIO, "I/O error"), "m")) is NodeUnreachable


@pytest.mark.parametrize(("error", "kind"), [
    (asyncssh.SFTPNoSuchFile("No such file"), TransferError),
    (asyncssh.SFTPPermissionDenied(MISLEADING), TransferError),
    (asyncssh.SFTPNoSpaceOnFilesystem("full"), TransferError),
    (asyncssh.SFTPFailure("failure"), TransferError),
    (asyncssh.SFTPConnectionLost(MISLEADING), NodeUnreachable),
    (asyncssh.SFTPNoConnection("x"), NodeUnreachable),
    (FileNotFoundError(errno.ENOENT, "No such file or folder", "/local/ckpt"), TransferError),
    (OSError(errno.ENOSPC, "No space left on device"), TransferError),
    (BrokenPipeError(errno.EPIPE, "Broken pipe"), NodeUnreachable),
    (OSError(errno.ENETUNREACH, "Network is unreachable"), NodeUnreachable),
])
def test_transfer_error(error: asyncssh.SFTPError | OSError, kind: type[ExecutorError]) -> None:
    assert type(transfer_error(error, "m")) is kind


def test_oneshot_replies() -> None:
    with pytest.raises(NodeRefused) as missing:
        parse_oneshot(b"", b"sh: 1: python3: not found\n", 127, label="n1", what="probe", python="python3")
    assert missing.value.reason is Refusal.PYTHON
    assert str(missing.value) == "n1: python3 not found on the node; hsched needs python3 >= 3.8 there"
    with pytest.raises(HelperError) as garbage:
        parse_oneshot(b"Traceback...\n", b"", 1, label="n1", what="status", python="python3")
    assert str(garbage.value) == "n1: status failed (exit status 1): Traceback..." and garbage.value.command == "status"
    with pytest.raises(HelperError) as answered:
        parse_oneshot(b'{"error": "unknown signal X"}\n', b"", 1, label="n1", what="signal", python="python3")
    assert str(answered.value) == "n1: node helper 'signal': unknown signal X"
    assert parse_oneshot(b'noise\n{"sent": true}\n', b"", 0, label="", what="signal", python="p") == {"sent": True}
    with pytest.raises(HelperError, match=r"^node helper 'probe': boom$"):
        check_reply({"error": "boom"}, "", "probe")


def test_errors_keep_their_class_and_reason_when_retold_copied_or_pickled() -> None:
    refused = NodeRefused("n1: HOST KEY CHANGED", Refusal.HOST_KEY_CHANGED)
    again = _retold(refused, "n1: HOST KEY CHANGED (next try in 3.0 s)")
    assert isinstance(again, NodeRefused) and again.reason is Refusal.HOST_KEY_CHANGED
    assert str(again) == "n1: HOST KEY CHANGED (next try in 3.0 s)" and str(refused) == "n1: HOST KEY CHANGED"
    for e in (refused, HelperError("n1: node helper 'launch': x", "launch"), NodeUnreachable("n1: gone")):
        for c in (copy.copy(e), pickle.loads(pickle.dumps(e))):
            assert type(c) is type(e) and str(c) == str(e) and vars(c) == vars(e)
    assert issubclass(NodeUnreachable, ExecutorError) and issubclass(ExecutorError, HschedError)
