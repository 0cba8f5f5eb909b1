"""What symmcoll raises. Every failure of a collective names the op, this rank and the peer(s) involved."""

from __future__ import annotations

from .calls import algorithm_name, difference

_RESET = ("The workspace is now inconsistent: call symmcoll.reset() on every rank before the next "
          "collective.")


class SymmcollError(RuntimeError):
    """Base class of symmcoll's runtime errors (also raised for calls made before initialisation)."""


def not_initialized() -> SymmcollError:
    """The one error of every call made before torch.distributed is initialised."""
    return SymmcollError("symmcoll: torch.distributed is not initialized (call torch.distributed."
                         "init_process_group, run under torchrun, or use symmcoll.launch)")


class SymmcollTimeoutError(SymmcollError):
    """A wait for a peer gave up after SYMMCOLL_TIMEOUT_S: the peer never arrived."""

    def __init__(self, op: str, rank: int, peers, detail: str = ""):
        peers = [peers] if isinstance(peers, int) else list(peers)
        self.op, self.rank, self.peers, self.detail = op, rank, peers, detail
        self.peer = peers[0] if peers else -1
        who = f"rank {peers[0]}" if len(peers) == 1 else f"ranks {peers}"
        super().__init__(
            f"symmcoll: {op} on rank {rank} timed out waiting for {who}{' ' + detail if detail else ''} "
            f"(did {who} call {op}? If it did, its own error names the rank it waited for). {_RESET}")


class SymmcollMismatchError(SymmcollError):
    """Ranks made different calls. ``fields``: the names of what differs (``op``, ``algorithm``,
    ``dtype``, ``reduce_op``, ``src``, ``x.shape``, ``b.shape``, ``splits``, ``group_size``, ...);
    ``peer``: a rank that made the other call; ``detail``: both values, where known."""

    def __init__(self, op: str, rank: int, peer: int, fields: list[str], detail: str = ""):
        self.op, self.rank, self.peer, self.fields, self.detail = op, rank, peer, list(fields), detail
        verb = "differs" if len(fields) <= 1 else "differ"
        super().__init__(
            f"symmcoll: {op} on rank {rank}: rank {peer} made a different call: {', '.join(fields) or 'call'} "
            f"{verb} between ranks {min(rank, peer)} and {max(rank, peer)}{f' ({detail})' if detail else ''}. "
            f"Every rank must make the same sequence of calls with the same op, algorithm, dtype, shapes, "
            f"reduce op, src and options. {_RESET}")


class SymmcollArgumentError(SymmcollError, ValueError):
    """A kernel found an argument wrong that only the device could check (device-side splits, routing,
    an output bound too small for what arrived). Raised once, on the rank that found it, by the next
    check; the workspace stays usable (the protocol completed, with the offending rows left out)."""

    def __init__(self, op: str, rank: int, argument: str, message: str):
        self.op, self.rank, self.argument = op, rank, argument
        super().__init__(f"symmcoll: {op} on rank {rank}: {message}")


# Argument codes of the kernels' reports (language/signals.py ARG_*).
_ARGUMENTS = {1: "max_rows", 2: "splits", 3: "topk_ids"}


def argument_error_from_record(record: list[int], new_reports: int) -> SymmcollArgumentError:
    """The exception for the report words [count, argument, value, limit, rank, desc] of the record."""
    _, code, value, limit, rank, desc = record[8:14]
    op = algorithm_name(desc)
    argument = _ARGUMENTS.get(code, f"argument#{code}")
    if argument == "max_rows":
        message = (f"max_rows = {limit} is too small: {value} rows arrived in one call; only the first {limit} "
                   f"were written (the received counts are exact). Pass a larger max_rows")
    elif argument == "splits":
        message = (f"splits (a device tensor) asks for {value} rows but x has {limit} rows, or holds a negative "
                   f"count: only the rows x holds were sent")
    else:
        message = f"topk_ids holds {value}, outside [-1, num_experts = {limit}): those slots were ignored"
    if new_reports > 1:
        message += f" ({new_reports} such reports since the last check; this is the latest)"
    return SymmcollArgumentError(op, rank, argument, message)


def error_from_record(record: list[int], announced: int, peer_global_rank: int | None = None) -> SymmcollError:
    """The exception for a kernel's error record [flag, kind, rank, peer, desc, peer desc, ...];
    ``announced`` is the descriptor the peer last announced to this rank (0 if none);
    ``peer_global_rank`` finds the fields the peer posted for its descriptor (calls.difference)."""
    _, kind, rank, peer, desc, peer_desc = record[:6]
    op = algorithm_name(desc)
    if kind == 2 and peer_desc == -1:  # language/transport.py FAILED_DESC: the peer had failed before
        return SymmcollMismatchError(op, rank, peer, [f"(rank {peer} had failed earlier; its own error names the "
                                                      f"cause)"])
    if kind == 2:
        return SymmcollMismatchError(op, rank, peer, *difference(desc, peer_desc, peer_global_rank))
    if announced and announced != desc:
        # Two kinds of protocol meet nowhere (a barrier against a barrier-free kernel): the wait timed
        # out, and the call the peer announced says why.
        fields, values = difference(desc, announced, peer_global_rank)
        return SymmcollMismatchError(op, rank, peer, fields,
                                     f"{values}; found after a wait timed out: rank {peer}'s last call here was "
                                     f"{algorithm_name(announced)}")
    return SymmcollTimeoutError(op, rank, peer)
