"""What a discovery plugin prints (docs/reference.md, "Discovery plugins"), read and checked: any accelerator
hsched has no tool for described by the lab's own executable. One JSON object:

    {"select_env": "TT_VISIBLE_DEVICES",            the variable that selects devices for a run (required)
     "select_by": "index",                          what it lists: "index" (default) or "id"
     "utilization": "probe",                        "probe": each device's `utilization` as of each probe; "none"
     "devices": [{"id": "n300-0",                   unique on the node (required)
                  "index": 0,                       the number the vendor's runtime uses (required)
                  "type": "tenstorrent-n300",       what `--gpu-type` matches (required)
                  "memory_mib": 24576,              device memory, or null (required)
                  "numa_node": 0,                   optional; null or absent: unknown
                  "pci_bus_id": "0000:41:00.0",     optional
                  "utilization": 0.0}],             optional percent
     "links": [{"a": "n300-0", "b": "n300-1", "kind": "ETH", "bandwidth_gbps": 200}]}   optional

A mistake is one PluginError line naming the field, never a half-read node."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from hsched.errors import UserError

_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_KIND = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,31}$")
_TYPE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 _.+/-]{0,63}$")
_RESERVED_ENV = frozenset({"PATH", "HOME", "USER", "LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONPATH", "SHELL"})
MAX_DEVICES = 1024


class PluginError(UserError):
    """Why a plugin's output cannot be read: one line."""


@dataclass(frozen=True, slots=True)
class PluginDevice:
    id: str
    index: int
    type: str
    memory_mib: int | None
    numa_node: int | None = None
    pci_bus_id: str | None = None
    utilization: float | None = None


@dataclass(frozen=True, slots=True)
class PluginLink:
    a: str
    b: str
    kind: str
    bandwidth_gbps: float | None = None


@dataclass(frozen=True, slots=True)
class PluginReport:
    select_env: str
    select_by: str
    utilization: str
    devices: tuple[PluginDevice, ...]
    links: tuple[PluginLink, ...]


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def parse_plugin_output(text: str) -> PluginReport:
    try:
        data = json.loads(text)
    except ValueError as e:
        first = text.strip().splitlines()[0][:60] if text.strip() else ""
        raise PluginError(f"printed no JSON ({e}): {first!r}" if first else "printed nothing") from None
    if not isinstance(data, dict):
        raise PluginError(f"expected a JSON object, found {type(data).__name__}")
    select_env = data.get("select_env")
    if select_env is None:
        raise PluginError('missing field "select_env" (the environment variable that selects devices)')
    if not isinstance(select_env, str) or not _ENV.match(select_env) or select_env in _RESERVED_ENV:
        raise PluginError(f'"select_env" must name an environment variable such as "TT_VISIBLE_DEVICES", '
                          f"found {select_env!r}")
    select_by = data.get("select_by", "index")
    if select_by not in ("index", "id"):
        raise PluginError(f'"select_by" must be "index" or "id", found {select_by!r}')
    utilization = data.get("utilization", "none")
    if utilization not in ("probe", "none"):
        raise PluginError(f'"utilization" must be "probe" or "none", found {utilization!r}')
    raw_devices = data.get("devices")
    if raw_devices is None:
        raise PluginError('missing field "devices" (a list, empty on a node without any)')
    if not isinstance(raw_devices, list) or len(raw_devices) > MAX_DEVICES:
        raise PluginError(f'"devices" must be a list of at most {MAX_DEVICES} objects')
    devices: list[PluginDevice] = []
    for i, d in enumerate(raw_devices):
        where = f"devices[{i}]"
        if not isinstance(d, dict):
            raise PluginError(f"{where} must be an object")
        for field in ("id", "index", "type", "memory_mib"):
            if field not in d:
                raise PluginError(f'{where}: missing field "{field}"')
        if not isinstance(d["id"], str) or not d["id"].strip() or not d["id"].isprintable() or "," in d["id"]:
            raise PluginError(f"{where}.id must be a non-empty printable string without commas")
        if not _int(d["index"]) or d["index"] < 0:
            raise PluginError(f"{where}.index must be an integer >= 0")
        if not isinstance(d["type"], str) or not _TYPE.match(d["type"]):
            raise PluginError(f"{where}.type must be a device model name such as \"tenstorrent-n300\"")
        if d["memory_mib"] is not None and (not _int(d["memory_mib"]) or d["memory_mib"] < 0):
            raise PluginError(f"{where}.memory_mib must be an integer >= 0 or null")
        numa = d.get("numa_node")
        if numa is not None and (not _int(numa) or numa < 0):
            raise PluginError(f"{where}.numa_node must be an integer >= 0 or null")
        bus = d.get("pci_bus_id")
        if bus is not None and not isinstance(bus, str):
            raise PluginError(f"{where}.pci_bus_id must be a string or null")
        util = d.get("utilization")
        if util is not None and (not _number(util) or not 0 <= util <= 100):
            raise PluginError(f"{where}.utilization must be a percent from 0 to 100 or null")
        devices.append(PluginDevice(id=d["id"], index=d["index"], type=d["type"], memory_mib=d["memory_mib"],
                                    numa_node=numa, pci_bus_id=bus,
                                    utilization=float(util) if util is not None and utilization == "probe" else None))
    ids = [d.id for d in devices]
    if len(set(ids)) != len(ids):
        raise PluginError("devices: two devices have the same id")
    if len({d.index for d in devices}) != len(devices):
        raise PluginError("devices: two devices have the same index")
    raw_links = data.get("links", [])
    if not isinstance(raw_links, list):
        raise PluginError('"links" must be a list')
    links: list[PluginLink] = []
    for i, lk in enumerate(raw_links):
        where = f"links[{i}]"
        if not isinstance(lk, dict):
            raise PluginError(f"{where} must be an object")
        for field in ("a", "b", "kind"):
            if field not in lk:
                raise PluginError(f'{where}: missing field "{field}"')
        if lk["a"] not in ids or lk["b"] not in ids or lk["a"] == lk["b"]:
            raise PluginError(f"{where}: a and b must be two different device ids")
        if not isinstance(lk["kind"], str) or not _KIND.match(lk["kind"]):
            raise PluginError(f'{where}.kind must be a short link name such as "ETH" or "XGMI"')
        bw = lk.get("bandwidth_gbps")
        if bw is not None and (not _number(bw) or bw <= 0):
            raise PluginError(f"{where}.bandwidth_gbps must be a number > 0 or null")
        links.append(PluginLink(lk["a"], lk["b"], lk["kind"].upper(), float(bw) if bw is not None else None))
    return PluginReport(select_env=select_env, select_by=select_by, utilization=utilization,
                        devices=tuple(devices), links=tuple(links))
