"""What hsched knows about accelerator models: memory, compute capability (or gfx target), generation, and
relative throughput for training and inference (V100 = 1.0), used by placement and the scheduling core.

The throughput figures are first-order and deliberately coarse (mixed-precision transformer training and
inference, per device, one number each); a lab that measured its own puts them in configuration:

    [models."H100 SXM"]            # overrides fields of a known entry
    train = 4.5
    [models."RTX 6000 Ada"]        # or adds a new one; `match` lists the name substrings that select it
    match = ["rtx 6000 ada"]
    memory_mib = 49140
    compute_capability = "8.9"
    train = 1.8
    inference = 2.4

Lookup is case-insensitive; an alias matches only at word boundaries (so `a10` does not select an A100 and
`l4` does not select an L40S), and the longest matching alias wins ("H100 NVL" beats "H100").
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from hsched.errors import ConfigError


@dataclass(frozen=True, slots=True)
class AcceleratorModel:
    key: str
    vendor: str
    generation: str
    memory_mib: int
    train: float
    """Relative training throughput, V100 = 1.0."""
    inference: float
    """Relative inference throughput, V100 = 1.0."""
    compute_capability: str | None = None
    gfx_target: str | None = None
    match: tuple[str, ...] = ()
    nvlink_links: int = 0
    """NVLink (or XGMI) links per device in the common SXM/OAM form; 0 for PCIe-only boards."""
    tdp_w: float | None = None
    """Board power limit in watts (the vendor's TDP/TBP); simulated devices draw up to it."""

    def cc_tuple(self) -> tuple[int, int] | None:
        return parse_cc(self.compute_capability)


def parse_cc(cc: str | None) -> tuple[int, int] | None:
    if not cc:
        return None
    m = re.match(r"^\s*(\d+)(?:\.(\d+))?\s*$", cc)
    return (int(m.group(1)), int(m.group(2) or 0)) if m else None


def _m(
    key: str,
    vendor: str,
    gen: str,
    mib: int,
    train: float,
    inf: float,
    cc: str | None,
    *match: str,
    gfx: str | None = None,
    links: int = 0,
) -> AcceleratorModel:
    return AcceleratorModel(
        key=key,
        vendor=vendor,
        generation=gen,
        memory_mib=mib,
        train=train,
        inference=inf,
        compute_capability=cc,
        gfx_target=gfx,
        match=match,
        nvlink_links=links,
    )


KNOWN_MODELS: tuple[AcceleratorModel, ...] = (
    _m("H200", "nvidia", "hopper", 143771, 5.5, 6.5, "9.0", "h200", links=18),
    _m(
        "H100 SXM",
        "nvidia",
        "hopper",
        81559,
        5.0,
        5.5,
        "9.0",
        "h100",
        "h100 sxm",
        "h100-sxm",
        "h100 80gb hbm3",
        "h100-sxm5-80gb",
        links=18,
    ),
    _m("H100 PCIe", "nvidia", "hopper", 81559, 3.8, 4.2, "9.0", "h100 pcie", "h100-pcie", "h100 80gb pcie"),
    _m("H100 NVL", "nvidia", "hopper", 95830, 4.5, 5.2, "9.0", "h100 nvl", links=12),
    _m(
        "A100 80GB SXM",
        "nvidia",
        "ampere",
        81920,
        2.7,
        2.8,
        "8.0",
        "a100-sxm4-80gb",
        "a100 80gb sxm",
        "a100-sxm-80gb",
        links=12,
    ),
    _m("A100 80GB PCIe", "nvidia", "ampere", 81920, 2.4, 2.5, "8.0", "a100 80gb pcie", "a100-pcie-80gb"),
    _m(
        "A100 40GB SXM",
        "nvidia",
        "ampere",
        40960,
        2.5,
        2.5,
        "8.0",
        "a100",
        "a100-sxm4-40gb",
        "a100 sxm4 40gb",
        links=12,
    ),
    _m("A100 40GB PCIe", "nvidia", "ampere", 40960, 2.3, 2.3, "8.0", "a100-pcie-40gb", "a100 pcie 40gb", "a100 pcie"),
    _m("A40", "nvidia", "ampere", 46068, 1.3, 1.6, "8.6", "a40", links=4),
    _m("A10", "nvidia", "ampere", 23028, 0.9, 1.3, "8.6", "a10", "a10g"),
    _m("L40S", "nvidia", "ada", 46068, 2.0, 2.6, "8.9", "l40s"),
    _m("L4", "nvidia", "ada", 23034, 0.6, 1.2, "8.9", "l4"),
    _m("V100", "nvidia", "volta", 16384, 1.0, 1.0, "7.0", "v100", "v100-sxm2-16gb", "v100-pcie-16gb", links=6),
    _m("V100 32GB", "nvidia", "volta", 32768, 1.0, 1.0, "7.0", "v100-sxm2-32gb", "v100-pcie-32gb", "v100s", links=6),
    _m("P100", "nvidia", "pascal", 16384, 0.55, 0.5, "6.0", "p100", links=4),
    _m("K80", "nvidia", "kepler", 11441, 0.2, 0.2, "3.7", "k80"),
    _m("T4", "nvidia", "turing", 15360, 0.35, 0.8, "7.5", "t4"),
    _m("RTX 4090", "nvidia", "ada", 24564, 1.6, 2.0, "8.9", "rtx 4090", "geforce rtx 4090"),
    _m("RTX 3090", "nvidia", "ampere", 24576, 1.1, 1.2, "8.6", "rtx 3090", "geforce rtx 3090", links=4),
    _m("MI300X", "amd", "cdna3", 196592, 4.0, 5.0, None, "mi300x", "mi300x oam", gfx="gfx942", links=7),
    _m("MI250X", "amd", "cdna2", 131072, 2.3, 2.0, None, "mi250x", "mi250", gfx="gfx90a", links=8),
    _m("MI210", "amd", "cdna2", 65536, 1.6, 1.4, None, "mi210", gfx="gfx90a", links=3),
)

# Vendors' board power (TDP/TBP) in watts, from the data sheets of the form each entry describes.
_TDP_W = {
    "H200": 700, "H100 SXM": 700, "H100 PCIe": 350, "H100 NVL": 400, "A100 80GB SXM": 400, "A100 80GB PCIe": 300,
    "A100 40GB SXM": 400, "A100 40GB PCIe": 250, "A40": 300, "A10": 150, "L40S": 350, "L4": 72, "V100": 300,
    "V100 32GB": 300, "P100": 250, "K80": 300, "T4": 70, "RTX 4090": 450, "RTX 3090": 350, "MI300X": 750,
    "MI250X": 560, "MI210": 300,
}
KNOWN_MODELS = tuple(replace(m, tdp_w=_TDP_W.get(m.key)) for m in KNOWN_MODELS)

_FIELD_NAMES = {f.name for f in fields(AcceleratorModel)}


def _alias_re(alias: str) -> re.Pattern[str]:
    # word boundaries made of anything that is not a letter or digit ("-", " ", "_" all separate words)
    return re.compile(r"(?<![a-z0-9])" + re.escape(alias.lower()) + r"(?![a-z0-9])")


@dataclass(frozen=True, slots=True)
class Catalog:
    """The known models plus configuration overrides; `lookup` finds the entry for a device's model string."""

    models: tuple[AcceleratorModel, ...] = KNOWN_MODELS
    _patterns: tuple[tuple[re.Pattern[str], int, AcceleratorModel], ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        pats = tuple((_alias_re(alias), len(alias), m) for m in self.models for alias in (m.match or (m.key.lower(),)))
        object.__setattr__(self, "_patterns", pats)

    def lookup(self, model: str | None) -> AcceleratorModel | None:
        """The entry whose alias appears in `model` (case-insensitive, whole words); longest alias wins."""
        if not model:
            return None
        low = model.lower()
        best: tuple[int, AcceleratorModel] | None = None
        for pat, n, m in self._patterns:
            if (best is None or n > best[0]) and pat.search(low):
                best = (n, m)
        return best[1] if best else None

    def get(self, key: str) -> AcceleratorModel | None:
        return next((m for m in self.models if m.key.lower() == key.lower()), None)

    def with_overrides(self, overrides: Mapping[str, Mapping[str, Any]] | None, *, source: str = "config") -> Catalog:
        """Merge `{model key: {field: value}}` from configuration; unknown keys add new models."""
        if not overrides:
            return self
        problems: list[str] = []
        models = {m.key.lower(): m for m in self.models}
        for key, vals in overrides.items():
            if not isinstance(vals, Mapping):
                problems.append(f"{source}: models.{key}: expected a table of fields")
                continue
            bad = sorted(set(vals) - _FIELD_NAMES - {"key"})
            if bad:
                problems.append(
                    f"{source}: models.{key}: unknown field(s) {', '.join(bad)}; "
                    f"known: {', '.join(sorted(_FIELD_NAMES - {'key'}))}"
                )
                continue
            clean = dict(vals)
            if "match" in clean:
                clean["match"] = tuple(str(x).lower() for x in clean["match"])
            old = models.get(key.lower())
            try:
                if old is not None:
                    models[key.lower()] = replace(old, **clean)
                else:
                    clean.setdefault("vendor", "unknown")
                    clean.setdefault("generation", "unknown")
                    clean.setdefault("match", (key.lower(),))
                    models[key.lower()] = AcceleratorModel(key=key, **clean)
            except TypeError as e:
                problems.append(f"{source}: models.{key}: {e}")
        if problems:
            raise ConfigError(problems)
        return Catalog(models=tuple(models.values()))


DEFAULT_CATALOG = Catalog()


def lookup_model(model: str | None, catalog: Catalog | None = None) -> AcceleratorModel | None:
    """Known facts for a device model string such as "NVIDIA A100-SXM4-80GB" (None when unknown)."""
    return (catalog or DEFAULT_CATALOG).lookup(model)
