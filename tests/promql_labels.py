"""Which labels the alerts of the generated rule files carry, read from their PromQL (parsed with
promql-parser, the Rust port of Prometheus' own parser).

An expression's result is a list of branches (one per `or` operand): each branch has the labels it is
guaranteed to carry and the labels it may carry. The rules for label propagation follow the Prometheus
engine (promql/engine.go `resultMetric`, `VectorAnd/Or/Unless`, aggregations):

- a selector carries its source's labels (scrape labels of its job + the labels its exporter writes), and a
  recorded series those of the recording rule (its expression + static labels); an `=` matcher with a
  non-empty value (or a regex that cannot match "") guarantees its label;
- `by (L)` keeps L, `without (L)` drops L, an aggregation without either keeps nothing; topk/bottomk keep all;
- `absent(sel)` carries only the `=` matchers of `sel`; `histogram_quantile` drops `le`;
- `a or b` is a's branches and b's; `a and b`, `a unless b` are a's; a one-to-one operation `on (L)` keeps
  only L, `ignoring (L)` drops L; `group_left (L)` keeps a's labels and adds L from b (`group_right` mirrors).
"""

from __future__ import annotations

import dataclasses
import re

import promql_parser as pp


@dataclasses.dataclass(frozen=True)
class Branch:
    guaranteed: frozenset[str]
    possible: frozenset[str]

    def keep(self, labels) -> "Branch":
        keep = frozenset(labels)
        return Branch(self.guaranteed & keep, self.possible & keep)

    def drop(self, labels) -> "Branch":
        drop = frozenset(labels)
        return Branch(self.guaranteed - drop, self.possible - drop)

    def add(self, guaranteed=(), possible=()) -> "Branch":
        return Branch(self.guaranteed | frozenset(guaranteed),
                      self.possible | frozenset(guaranteed) | frozenset(possible))


SCALAR: list[Branch] = []  # a number has no labels and no branches


def _op(matcher) -> str:
    return str(matcher.op).rsplit(".", 1)[-1]  # Equal | NotEqual | Re | NotRe


def _present_labels(matchers) -> set[str]:
    """Labels a selector's matchers guarantee: `l="v"` with v non-empty, `l=~"re"` where re cannot match ""."""
    out = set()
    for m in matchers.matchers:
        if m.name == "__name__":
            continue
        if _op(m) == "Equal" and m.value:
            out.add(m.name)
        elif _op(m) == "Re" and not re.fullmatch(m.value, ""):
            out.add(m.name)
    return out


class LabelFlow:
    """`source(name, matcher_labels) -> list[Branch]` gives a raw series' labels; `recorded` maps a recorded
    name to (static labels, expression) of each recording rule writing it."""

    def __init__(self, source, recorded: dict[str, list[tuple[dict[str, str], str]]]):
        self.source = source
        self.recorded = recorded

    def branches(self, expr: str) -> list[Branch]:
        return self._walk(pp.parse(expr))

    def _selector(self, vs) -> list[Branch]:
        present = _present_labels(vs.matchers)
        equal = {m.name: m.value for m in vs.matchers.matchers if _op(m) == "Equal"}
        if vs.name in self.recorded:
            out = []
            for static, expr in self.recorded[vs.name]:
                if any(equal.get(k, v) != v for k, v in static.items()):
                    continue  # that recording rule's series cannot match this selector
                out += [b.add(static) for b in self.branches(expr)]
        else:
            out = self.source(vs.name, equal)
        return [b.add(present) for b in out]

    def _walk(self, node) -> list[Branch]:
        kind = type(node).__name__
        if kind in ("NumberLiteral", "StringLiteral"):
            return SCALAR
        if kind == "VectorSelector":
            return self._selector(node)
        if kind == "MatrixSelector":
            return self._selector(node.vector_selector)
        if kind in ("ParenExpr", "UnaryExpr", "SubqueryExpr"):
            return self._walk(node.expr)
        if kind == "Call":
            return self._call(node)
        if kind == "AggregateExpr":
            return self._aggregate(node)
        if kind == "BinaryExpr":
            return self._binary(node)
        raise ValueError(f"unsupported PromQL node {kind}: {node}")

    def _call(self, node) -> list[Branch]:
        name, args = node.func.name, list(node.args)
        if name == "absent":
            inner = args[0]
            vs = inner.vector_selector if type(inner).__name__ == "MatrixSelector" else inner
            eq = {m.name for m in vs.matchers.matchers
                  if _op(m) == "Equal" and m.value and m.name != "__name__"}
            return [Branch(frozenset(eq), frozenset(eq))]
        if name in ("time", "vector", "scalar", "pi"):
            return SCALAR if name != "vector" else [Branch(frozenset(), frozenset())]
        if name == "histogram_quantile":
            return [b.drop(["le"]) for b in self._walk(args[1])]
        if name in ("label_replace", "label_join"):
            dst = args[1].val if hasattr(args[1], "val") else str(args[1]).strip('"')
            replacement = args[2].val if hasattr(args[2], "val") else str(args[2]).strip('"')
            if name == "label_replace" and replacement == "":   # an empty value removes the label
                return [b.drop([dst]) for b in self._walk(args[0])]
            return [b.add([dst]) for b in self._walk(args[0])]
        for arg in args:  # rate, increase, changes, clamp_min, round ...: the vector argument's labels
            if type(arg).__name__ not in ("NumberLiteral", "StringLiteral"):
                return self._walk(arg)
        return SCALAR

    def _aggregate(self, node) -> list[Branch]:
        inner = self._walk(node.expr)
        op = str(node.op)
        if op in ("topk", "bottomk", "limitk", "limit_ratio"):
            return inner
        mod = node.modifier
        if mod is None:
            out = [Branch(frozenset(), frozenset())]
        elif str(mod.type).endswith("By"):
            out = [b.keep(mod.labels) for b in inner]
        else:
            out = [b.drop(mod.labels) for b in inner]
        if op == "count_values":
            out = [b.add([str(node.param).strip('"')]) for b in out]
        return out or [Branch(frozenset(), frozenset())]

    def _binary(self, node) -> list[Branch]:
        op = str(node.op)
        lhs, rhs = self._walk(node.lhs), self._walk(node.rhs)
        if op == "or":
            return lhs + rhs
        if op in ("and", "unless"):
            return lhs
        if not lhs or not rhs:  # vector <op> scalar keeps the vector's labels
            return lhs or rhs
        mod = node.modifier
        card = str(mod.card) if mod is not None else "OneToOne"
        matching = mod.matching if mod is not None else None
        include = list(getattr(mod, "group_labels", None) or []) if mod is not None else []
        if card.endswith("OneToOne"):
            if matching is None:
                return lhs
            if str(matching.type).endswith("Include"):
                return [b.keep(matching.labels) for b in lhs]
            return [b.drop(matching.labels) for b in lhs]
        many, one = (lhs, rhs) if card.endswith("ManyToOne") else (rhs, lhs)
        sure = frozenset.intersection(*(b.guaranteed for b in one)) & frozenset(include)
        maybe = frozenset.union(*(b.possible for b in one)) & frozenset(include)
        return [b.add(sure, maybe) for b in many]
