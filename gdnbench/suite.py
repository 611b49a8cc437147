"""Suites: pydantic models of a suite and its cases, YAML loading, axes expansion, validation.

A suite file holds suite-level settings, ``defaults`` for every case, explicit ``cases`` and
``axes`` (a mapping of field -> list of values, or a list of such mappings) whose cartesian
product is taken. A case entry may carry its own ``axes`` too. Every expanded case is validated
on its own, so an error names the file, the case and the field.
"""

from __future__ import annotations

import difflib
import hashlib
import itertools
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

Op = Literal["prefill", "decode"]
Dtype = Literal["bf16", "fp16", "fp32"]

SUITES_DIR = Path(__file__).resolve().parent.parent / "suites"


class SuiteError(Exception):
    """Bad suite input. The message names the file, the case and the field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Case(_Strict):
    """One benchmark problem: shapes and settings, in the canonical conventions of docs/design.md."""

    op: Op = "prefill"
    mode: Literal["padded", "varlen"] = "padded"
    B: int | None = Field(None, ge=1, description="batch (padded) or number of sequences (decode)")
    T: int | None = Field(None, ge=1, description="tokens per sequence (padded); tokens per step (decode)")
    seq_lens: tuple[int, ...] | None = Field(None, description="varlen: explicit sequence lengths")
    num_seqs: int | None = Field(None, ge=1, description="varlen: number of sequences (seeded random split)")
    total_tokens: int | None = Field(None, ge=1, description="varlen: total tokens (seeded random split)")
    H: int = Field(..., ge=1, description="q/k heads")
    HV: int | None = Field(None, ge=1, description="v heads (GVA: a multiple of H); defaults to H")
    K: int | None = Field(None, ge=1, description="key head dim")
    V: int | None = Field(None, ge=1, description="value head dim")
    D: int | None = Field(None, ge=1, description="sets K and V together")
    dtype: Dtype = "bf16"
    state_dtype: Literal["fp32", "bf16"] = "fp32"
    gate_norm: float = Field(1.0, gt=0, description="divides the log decay; larger = weaker decay")
    mask_p: float = Field(0.0, ge=0, le=1, description="share of g entries set to 0")
    half_life: tuple[float, float] | None = Field(
        None, description="gate regime: each value head's mean half-life in tokens, log-uniform in [lo, hi] "
        "(a number: that half-life; inf: no decay); the per-token decay varies around it as a gated model's does")
    scale: float | None = Field(None, gt=0, description="q scale; default K**-0.5")
    qk_l2norm: Literal["pre", "kernel"] = "pre"
    gating: Literal["pre", "raw"] = "pre"
    initial_state: Literal["none", "zeros", "random"] | None = None
    output_final_state: bool = True
    pool_size: int | None = Field(None, ge=1,
                                  description="decode: state pool slots (default B; B*T with per_token_slots)")
    slots: Literal["contiguous", "scattered"] = "contiguous"
    per_token_slots: bool = Field(
        False, description="decode, T >= 2 (speculative verify): slot_idx is [B, T], the state after token t "
        "goes to slot_idx[b, t], and sequence b starts from slot_idx[b, num_accepted_tokens[b] - 1]")

    @field_validator("seq_lens")
    @classmethod
    def _positive_lens(cls, v: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if v is not None and (len(v) == 0 or any(n < 1 for n in v)):
            raise ValueError("must be a non-empty list of positive lengths")
        return v

    @field_validator("half_life", mode="before")
    @classmethod
    def _half_life_range(cls, v: Any) -> Any:
        def number(x: Any) -> Any:  # YAML reads `inf` as a string (`.inf` as a float)
            return float("inf") if isinstance(x, str) and x.strip().lower() in ("inf", ".inf") else x

        if v is None:
            return v
        if isinstance(v, (list, tuple)):
            return tuple(number(x) for x in v)
        return (number(v), number(v))  # one number (or inf): every head the same mean half-life

    @field_validator("half_life")
    @classmethod
    def _half_life_valid(cls, v: tuple[float, float] | None) -> tuple[float, float] | None:
        if v is None:
            return v
        lo, hi = v
        if not 0 < lo <= hi:
            raise ValueError("needs 0 < lo <= hi (half-lives in tokens)")
        if math.isinf(hi) and not math.isinf(lo):
            raise ValueError("a range is finite; inf alone means no decay")
        return v

    @model_validator(mode="after")
    def _resolve(self) -> Case:
        def need(cond: bool, msg: str) -> None:
            if not cond:
                raise ValueError(msg)

        fill: dict[str, Any] = {}
        if self.D is not None:
            need(self.K in (None, self.D) and self.V in (None, self.D), "D conflicts with K/V")
            fill.update(K=self.D, V=self.D, D=None)
        if (fill.get("K", self.K)) is None or (fill.get("V", self.V)) is None:
            raise ValueError("give D, or both K and V")
        hv = self.HV if self.HV is not None else self.H
        need(hv % self.H == 0, f"HV={hv} must be a multiple of H={self.H}")
        fill["HV"] = hv
        if self.gating == "raw":
            need(self.gate_norm == 1 and self.mask_p == 0,
                 "gate_norm and mask_p shape the pre-computed g; with gating: raw, g comes from a and A_log")
        need(self.half_life is None or self.gate_norm == 1,
             "gate_norm scales FLA's recipe of g; half_life sets the decay itself: give one of them")
        if self.op == "decode":
            need(self.mode == "padded", "decode cases are mode: padded (B sequences of T tokens)")
            need(self.B is not None, "decode needs B")
            fill["T"] = self.T or 1
            need(not self.per_token_slots or fill["T"] >= 2, "per_token_slots needs T >= 2 (speculative verify)")
            slots = self.B * fill["T"] if self.per_token_slots else self.B  # one distinct slot per state written
            fill["pool_size"] = self.pool_size or slots
            need(fill["pool_size"] >= slots, f"pool_size={fill['pool_size']} is smaller than the {slots} slots "
                 "the case writes")
            need(self.initial_state in (None, "zeros", "random"), "decode state comes from the pool")
            fill["initial_state"] = self.initial_state or "random"
        else:
            need(self.pool_size is None and self.slots == "contiguous" and not self.per_token_slots,
                 "pool_size/slots/per_token_slots are for decode")
            fill["initial_state"] = self.initial_state or "none"
        if self.mode == "padded":
            need(self.B is not None and (self.T is not None or "T" in fill), "padded cases need B and T")
            need(self.seq_lens is None and self.num_seqs is None and self.total_tokens is None,
                 "seq_lens/num_seqs/total_tokens are for varlen cases")
        else:
            need(self.B is None and self.T is None, "varlen cases take seq_lens or num_seqs+total_tokens, not B/T")
            if self.seq_lens is None:
                need(self.num_seqs is not None and self.total_tokens is not None,
                     "varlen needs seq_lens, or num_seqs and total_tokens")
                need(self.total_tokens >= self.num_seqs, "total_tokens must be >= num_seqs")
            else:
                need(self.num_seqs in (None, len(self.seq_lens))
                     and self.total_tokens in (None, sum(self.seq_lens)),
                     "num_seqs/total_tokens disagree with seq_lens")
                fill.update(num_seqs=len(self.seq_lens), total_tokens=sum(self.seq_lens))
        # frozen model: fill derived fields through __dict__ once, at validation time
        self.__dict__.update(fill)
        return self

    # ---- derived sizes -------------------------------------------------------------------------
    @property
    def N(self) -> int:
        """Number of sequences (rows of the initial/final state)."""
        return self.num_seqs if self.mode == "varlen" else self.B  # type: ignore[return-value]

    @property
    def state_writes(self) -> int:
        """States each sequence writes to the pool: one, or one per token with per_token_slots."""
        return self.T if self.per_token_slots else 1  # type: ignore[return-value]

    @property
    def tokens(self) -> int:
        """Tokens in the batch, all sequences together."""
        return self.total_tokens if self.mode == "varlen" else self.B * self.T  # type: ignore[operator]

    @property
    def id(self) -> str:
        """Stable, human-readable id: the same fields always give the same id."""
        if self.mode == "varlen":
            size = f"N={self.num_seqs},T={self.total_tokens}"
            if self.seq_lens is not None:
                size += f",lens={_short_hash(self.seq_lens)}"
        else:
            size = f"B={self.B},T={self.T}"
        parts = [size, f"H={self.H},HV={self.HV},K={self.K},V={self.V}", self.dtype,
                 f"gn={_num(self.gate_norm)},mp={_num(self.mask_p)}"]
        extras = {
            "state": self.state_dtype if self.state_dtype != "fp32" else None,
            "scale": _num(self.scale) if self.scale is not None else None,
            "l2": "kernel" if self.qk_l2norm == "kernel" else None,
            "gating": "raw" if self.gating == "raw" else None,
            "hl": _range(self.half_life) if self.half_life is not None else None,
            "init": self.initial_state if self.initial_state != ("random" if self.op == "decode" else "none") else None,
            "final": "no" if not self.output_final_state else None,
            "pool": self.pool_size if self.op == "decode" and self.pool_size != self.N * self.state_writes else None,
            "slots": "scattered" if self.slots == "scattered" else None,
            "spec": "per-token" if self.per_token_slots else None,
        }
        parts += [f"{k}={v}" for k, v in extras.items() if v is not None]
        return f"{self.op}/{self.mode}/" + ",".join(parts)

    def fields(self) -> dict[str, Any]:
        """The case's resolved fields as plain data (for CSV rows, dumps and JSON)."""
        d = self.model_dump(exclude={"D"})
        d["seq_lens"] = list(self.seq_lens) if self.seq_lens is not None else None
        return d


class Tolerances(_Strict):
    """Relative RMS error allowed per dtype: outputs by the input dtype, states by the state dtype."""

    bf16: float = Field(5e-3, gt=0)
    fp16: float = Field(5e-3, gt=0)
    fp32: float = Field(1e-3, gt=0)

    def for_dtype(self, dtype: str) -> float:
        return getattr(self, dtype)


class TimingSettings(_Strict):
    """How each (case, backend) is timed (docs/design.md, "Measurement"). CLI flags override these."""

    timer: Literal["auto", "graph", "events", "wall"] = "auto"
    l2: Literal["cold", "warm"] = "cold"
    warmup: int = Field(3, ge=1)
    min_samples: int = Field(10, ge=1)
    max_samples: int = Field(500, ge=1)
    min_time_s: float = Field(0.2, ge=0)
    max_time_s: float = Field(5.0, gt=0)
    rel_ci: float = Field(0.01, gt=0, description="stop when the median's 95% CI half-width is this small")
    timeout_s: float = Field(600.0, gt=0, description="per (case, backend), and for a case's inputs and reference: "
                                                      "past this, a TIMEOUT row")


class ReferenceSettings(_Strict):
    backend: Literal["torch.recurrent", "torch.chunk"] = "torch.recurrent"
    precision: Literal["fp32", "fp64"] = "fp32"


class Suite(_Strict):
    name: str
    description: str = ""
    path: str = ""
    seed: int = 0
    backends: tuple[str, ...] = ("torch.recurrent", "torch.chunk")
    baseline: str | dict[Op, str] | None = Field(
        None, description="backend the speedups are relative to, or one per op: {prefill: a, decode: b}")
    reference: ReferenceSettings = ReferenceSettings()
    tolerances: Tolerances = Tolerances()
    timing: TimingSettings = TimingSettings()
    cases: tuple[Case, ...]
    sha256: str = ""

    @model_validator(mode="after")
    def _check(self) -> Suite:
        for name in self.baselines().values():
            if name not in self.backends:
                raise ValueError(f"baseline {name!r} is not one of backends {list(self.backends)}")
        return self

    def baselines(self) -> dict[str, str]:
        """The baseline backend per op ({} when the suite names none)."""
        if isinstance(self.baseline, str):
            return {"prefill": self.baseline, "decode": self.baseline}
        return dict(self.baseline or {})


_SUITE_KEYS = {"name", "description", "seed", "backends", "baseline", "reference", "tolerances",
               "timing", "defaults", "cases", "axes"}


def resolve_suite_path(spec: str | Path) -> Path:
    """A path to a YAML file, or the name of a shipped suite (``smoke`` -> suites/smoke.yaml)."""
    p = Path(spec)
    if p.exists():
        return p
    shipped = SUITES_DIR / f"{spec}.yaml"
    if shipped.exists():
        return shipped
    raise SuiteError(f"{spec}: no such file, and no shipped suite of that name "
                     f"(shipped: {', '.join(shipped_suites())})")


def shipped_suites() -> list[str]:
    return sorted(p.stem for p in SUITES_DIR.glob("*.yaml"))


def load_suite(spec: str | Path) -> Suite:
    """Read, expand and validate a suite. Raises SuiteError naming file, case and field."""
    path = resolve_suite_path(spec)
    if path.is_dir():
        raise SuiteError(f"{path}: a directory; a suite is a YAML file (shipped: {', '.join(shipped_suites())})")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise SuiteError(f"{path}: cannot read it: {e}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise SuiteError(f"{path}: not valid YAML: {e}") from None
    return parse_suite(raw, path=str(path), sha256=hashlib.sha256(text.encode()).hexdigest())


def parse_suite(raw: Any, *, path: str = "<suite>", sha256: str = "") -> Suite:
    if not isinstance(raw, dict):
        raise SuiteError(f"{path}: a suite is a YAML mapping, got {type(raw).__name__}")
    unknown = set(raw) - _SUITE_KEYS
    if unknown:
        hint = did_you_mean(sorted(unknown)[0], _SUITE_KEYS)
        raise SuiteError(f"{path}: unknown suite key(s) {sorted(unknown)}{hint}; allowed: {sorted(_SUITE_KEYS)}")
    defaults = raw.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise SuiteError(f"{path}: 'defaults' must be a mapping of case fields")
    entries = raw.get("cases") or []
    if not isinstance(entries, list):
        raise SuiteError(f"{path}: 'cases' must be a list of mappings")
    if raw.get("axes"):
        entries = [*entries, {"axes": raw["axes"]}]
    if not entries:
        raise SuiteError(f"{path}: the suite has no cases (give 'cases' and/or 'axes')")

    cases: list[Case] = []
    where: dict[str, str] = {}
    for i, entry in enumerate(entries):
        label = f"cases[{i}]" if i < len(raw.get("cases") or []) else "axes"
        for j, fields in enumerate(_expand(entry, path, label)):
            tag = label if j == 0 and "axes" not in entry else f"{label} (combination {j})"
            case = _validate_case({**defaults, **fields}, path, tag)
            if case.id in where:
                raise SuiteError(f"{path}: {tag}: duplicate case id {case.id} (also {where[case.id]})")
            where[case.id] = tag
            cases.append(case)

    suite_fields = {k: v for k, v in raw.items() if k not in ("defaults", "cases", "axes")}
    if "backends" in suite_fields and isinstance(suite_fields["backends"], str):
        suite_fields["backends"] = [b.strip() for b in suite_fields["backends"].split(",")]
    try:
        return Suite(**suite_fields, cases=tuple(cases), path=path, sha256=sha256)
    except ValidationError as e:
        raise SuiteError(_format_errors(path, "suite", e)) from None


def _expand(entry: Any, path: str, label: str) -> list[dict[str, Any]]:
    if not isinstance(entry, dict):
        raise SuiteError(f"{path}: {label}: a case is a mapping of fields, got {entry!r}")
    axes = entry.get("axes")
    base = {k: v for k, v in entry.items() if k != "axes"}
    if axes is None:
        return [base]
    grids = axes if isinstance(axes, list) else [axes]
    out: list[dict[str, Any]] = []
    for grid in grids:
        if not isinstance(grid, dict) or not grid:
            raise SuiteError(f"{path}: {label}: 'axes' must map field names to lists of values")
        for name, values in grid.items():
            if not isinstance(values, list) or not values:
                raise SuiteError(f"{path}: {label}: field '{name}': an axis needs a non-empty list")
        names = list(grid)
        out += [{**base, **dict(zip(names, combo))} for combo in itertools.product(*grid.values())]
    return out


def _validate_case(fields: dict[str, Any], path: str, tag: str) -> Case:
    try:
        return Case(**fields)
    except ValidationError as e:
        raise SuiteError(_format_errors(path, tag, e, fields)) from None
    except TypeError as e:  # e.g. a non-string key
        raise SuiteError(f"{path}: {tag}: {e}") from None


def _format_errors(path: str, tag: str, err: ValidationError, fields: dict[str, Any] | None = None) -> str:
    lines = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "(case)"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown field" + did_you_mean(str(e["loc"][-1]), _field_names(e["loc"][:-1]))
        got = f" (got {e['input']!r})" if e["type"] not in ("extra_forbidden", "missing") and e["loc"] else ""
        lines.append(f"{path}: {tag}: field '{loc}': {msg}{got}")
    if fields is not None:
        lines.append(f"  in case {fields}")
    return "\n".join(lines)


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """'; did you mean X?' for the known name closest to ``name`` (case first), or ''."""
    known = sorted(known)
    same_case = [k for k in known if k.lower() == name.lower()]
    close = same_case or difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def _field_names(loc: tuple) -> list[str]:
    """The field names allowed at ``loc`` (a case's, or a suite section's such as ``timing``)."""
    if not loc:
        return [*Case.model_fields, "axes"]
    field = Suite.model_fields.get(str(loc[0]))
    if field is None:
        return []
    for model in (field.annotation, *get_args(field.annotation)):
        if isinstance(model, type) and issubclass(model, BaseModel):
            return list(model.model_fields)
    return []


def _num(x: float) -> str:
    return f"{x:g}"


def _range(bounds: tuple[float, float]) -> str:
    lo, hi = bounds
    return _num(lo) if lo == hi else f"{_num(lo)}-{_num(hi)}"


def _short_hash(values: Any) -> str:
    return hashlib.sha256(repr(tuple(values)).encode()).hexdigest()[:8]
