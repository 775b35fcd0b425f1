"""A synthetic world of fictional entities: corpus, single- and multi-hop questions, expert chains.

The world is the project's "model organism": a search task small and well-posed enough that a tiny
transformer learns to search in minutes on a CPU, and one that pretrained knowledge cannot solve
(every name is made up from a syllable inventory).

Chain semantics. Every relation is a function from a subject entity to one object entity
(`capital(country) -> city`, ...). A question with `h` hops names a start entity `e0` and a
relation path `r1..rh`; it asks for `e_h = r_h(... r_2(r_1(e0)))`, phrased as nested noun phrases
("What is the birthplace of the founder of Kelmora?" = birthplace(founder(Kelmora))). Hop `i`
is answered by the one passage that states `r_i(e_{i-1}) = e_i`; the expert query for it is
"<relation keyword> of <e_{i-1}>", so the answer of hop `i` is the search key of hop `i+1`. Every
fact passage contains its relation keyword and the subject's name, which is what makes the
expert queries rank the gold passage first under BM25. All entities in one chain are distinct.
"""

from __future__ import annotations

import dataclasses
import random
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field

from llds.config.loader import Overrides, load, validate
from llds.config.schema import Invalid, check, section
from llds.data.example import QAExample
from llds.errors import ConfigError, UserInputError
from llds.io import write_json, write_jsonl

ENTITY_TYPES = ("country", "city", "person", "river", "currency")

# Share of the entities given to each type; facts per entity are highest for countries and cities.
_TYPE_SHARES = {"country": 0.2, "city": 0.3, "person": 0.25, "river": 0.15, "currency": 0.1}


@dataclass(frozen=True)
class Relation:
    """A typed functional relation and the text banks that express it."""

    name: str
    subject_type: str
    object_type: str
    keyword: str  # appears in every passage template and in the expert query
    passages: tuple[str, ...]  # {s} subject reference, {o} object reference
    questions: tuple[str, ...]  # {x} reference to the subject (a name or a nested phrase)
    phrase: str  # noun phrase for r(x), used when this relation is nested inside another


RELATIONS: dict[str, Relation] = {
    r.name: r
    for r in (
        Relation(
            "capital",
            "country",
            "city",
            "capital",
            (
                "The capital of {s} is {o}.",
                "{o} is the capital of {s}.",
                "{s} is governed from {o}, its capital.",
                "The capital city of {s} is {o}.",
            ),
            (
                "What is the capital of {x}?",
                "Which city is the capital of {x}?",
                "Name the capital of {x}.",
                "What city serves as the capital of {x}?",
            ),
            "the capital of {x}",
        ),
        Relation(
            "currency",
            "country",
            "currency",
            "currency",
            (
                "The currency of {s} is {o}.",
                "{s} uses {o} as its currency.",
                "People in {s} pay with {o}, the national currency.",
                "{o} is the official currency of {s}.",
            ),
            (
                "What is the currency of {x}?",
                "Which currency is used in {x}?",
                "What currency do people in {x} pay with?",
                "Name the currency of {x}.",
            ),
            "the currency of {x}",
        ),
        Relation(
            "founder",
            "city",
            "person",
            "founder",
            (
                "The founder of {s} was {o}.",
                "{o} was the founder of {s}.",
                "{s} was built by its founder, {o}.",
                "{o} is remembered as the founder of {s}.",
            ),
            (
                "Who was the founder of {x}?",
                "Who is remembered as the founder of {x}?",
                "Name the founder of {x}.",
                "Which person was the founder of {x}?",
            ),
            "the founder of {x}",
        ),
        Relation(
            "river",
            "city",
            "river",
            "river",
            (
                "The river of {s} is {o}.",
                "{o} flows through {s}.",
                "{s} lies on {o}.",
                "{s} was built beside {o}.",
            ),
            (
                "Which river flows through {x}?",
                "What is the river of {x}?",
                "Name the river that flows through {x}.",
                "On which river does {x} lie?",
            ),
            "the river of {x}",
        ),
        Relation(
            "birthplace",
            "person",
            "city",
            "birthplace",
            (
                "The birthplace of {s} is {o}.",
                "{o} is the birthplace of {s}.",
                "{s} was born in {o}, the birthplace named in the records.",
                "Records give {o} as the birthplace of {s}.",
            ),
            (
                "What is the birthplace of {x}?",
                "In which city was {x} born?",
                "Which city is the birthplace of {x}?",
                "Where was {x} born?",
            ),
            "the birthplace of {x}",
        ),
        Relation(
            "source",
            "river",
            "country",
            "source",
            (
                "The source of {s} is in {o}.",
                "{s} has its source in {o}.",
                "{s} rises in {o}, where its source lies.",
                "{o} holds the source of {s}.",
            ),
            (
                "In which country is the source of {x}?",
                "Where is the source of {x}?",
                "Which country holds the source of {x}?",
                "What country has the source of {x}?",
            ),
            "the country with the source of {x}",
        ),
    )
}

# Distractor sentences mention an entity but state none of its relations (and no relation keyword
# except the word "river" inside a river's own reference).
_DISTRACTORS = {
    "country": (
        "{s} is a country known for its {thing}.",
        "Travellers to {s} often mention its {thing}.",
        "{s} holds a yearly festival of {thing}.",
    ),
    "city": (
        "{s} is a city famous for its {thing}.",
        "Visitors to {s} praise its {thing}.",
        "Old songs from {s} tell of {thing}.",
    ),
    "person": (
        "{s} was known for a love of {thing}.",
        "{s} wrote a short book about {thing}.",
        "Stories about {s} often involve {thing}.",
    ),
    "river": (
        "Boats on {s} carry {thing}.",
        "Painters like to show {s} with {thing}.",
        "In summer, {s} is full of {thing}.",
    ),
    "currency": (
        "Coins of {s} show pictures of {thing}.",
        "Collectors value old notes of {s} that show {thing}.",
        "{s} was once traded for {thing}.",
    ),
}
_THINGS = (
    "wool",
    "tea",
    "glass",
    "music",
    "bridges",
    "gardens",
    "markets",
    "horses",
    "copper",
    "salt",
    "lanterns",
    "poetry",
    "clocks",
    "fish",
    "bells",
    "owls",
    "silk",
    "mills",
    "towers",
    "kites",
)

# Syllables: onset + vowel + coda. A name's last syllable avoids endings an English stemmer would
# strip (-s, -e, -al, -ed...), so every name stays one intact BM25 term after stemming.
_ONSETS = (
    "b",
    "d",
    "f",
    "g",
    "k",
    "l",
    "m",
    "n",
    "p",
    "r",
    "s",
    "t",
    "v",
    "z",
    "br",
    "dr",
    "kr",
    "tr",
    "th",
    "sh",
    "gl",
    "pl",
)
_VOWELS = ("a", "e", "i", "o", "u")
_CODAS = ("", "", "", "n", "r", "l", "m")
_FINAL_VOWELS = ("a", "o", "u")
_FINAL_CODAS = ("", "", "", "n", "r", "k", "m")
# Suffixes an English (Snowball) stemmer removes; no name may end in one.
_STEMMED_ENDINGS = (
    "ator",
    "li",
    "iti",
    "al",
    "ic",
    "er",
    "ant",
    "ent",
    "ism",
    "ate",
    "ous",
    "ive",
    "ize",
    "ion",
    "ful",
    "ness",
    "ance",
    "ence",
    "able",
    "ible",
    "ment",
)


def parse_hop_mix(value: Any) -> Any:
    """`"1:0.5,2:0.35,3:0.15"` (the compact command-line form, `hop_mix=1:0.5,2:0.5`) ->
    `{"1": "0.5", ...}`, which the field's type then reads as {1: 0.5, ...}; a mapping passes."""
    if not isinstance(value, str):
        return value
    pairs = [part.partition(":") for part in value.split(",")]
    if any(not sep or not hops.strip() for hops, sep, _ in pairs):
        raise ConfigError(f"expected HOPS:WEIGHT pairs like 1:0.5,2:0.5, got {value!r}")
    return {hops.strip(): weight.strip() for hops, _, weight in pairs}


RelationName = Literal[tuple(RELATIONS)]  # type: ignore[valid-type]
HopMix = Annotated[
    dict[Annotated[int, Field(ge=1)], Annotated[float, Field(ge=0)]],
    BeforeValidator(parse_hop_mix),
    Field(min_length=1),
]


@section(key="world")
class WorldConfig:
    """Everything that determines a world; the same config always yields the same files.

    The defaults are the organism world; `world-hard` is a shipped preset (`llds world --config
    world-hard`). Loaded like every config of the project: `load_world_config`."""

    seed: int = 0
    """generation seed"""
    num_entities: int = Field(default=240, ge=10)
    """number of entities"""
    relations: tuple[RelationName, ...] = Field(default=tuple(RELATIONS), min_length=1)
    """relations to draw facts from"""
    hop_mix: HopMix = dataclasses.field(default_factory=lambda: {1: 0.5, 2: 0.35, 3: 0.15})
    """share of questions per hop count, e.g. {1: 0.5, 2: 0.5} (or `1:0.5,2:0.5` on the
    command line)"""
    distractors_per_entity: int = Field(default=1, ge=0)
    """distractor passages per entity"""
    question_templates_per_relation: int = Field(default=2, ge=1, le=4)
    """question phrasings per relation, 1..4"""
    passage_templates_per_relation: int = Field(default=2, ge=1, le=4)
    """passage phrasings per relation, 1..4"""
    name_similarity: float = Field(default=0.0, ge=0, le=1)
    """0..1: chance a new name is a near-duplicate of an existing one"""
    syllable_inventory: int = Field(default=0, ge=0)
    """0: names draw syllables from the open onset x vowel x coda inventory (hundreds, names
    differ in most pieces); N >= 4: every name is built from one shared set of N syllables, so
    a right and a wrong answer share sub-word pieces and their tokens (the theorem's similar
    responses); near-duplicate names are then allowed, one name may not start another"""
    name_length: int = Field(default=0, ge=0, le=5)
    """syllables per name; 0: two or three (drawn 3:1)"""
    num_train: int = Field(default=480, ge=1)
    """number of training questions (an empty split trains nothing: refused)"""
    num_test: int = Field(default=120, ge=1)
    """number of test questions (an empty split evaluates nothing: refused)"""

    def __post_init__(self) -> None:
        if sum(self.hop_mix.values()) <= 0:
            raise Invalid("hop_mix", "weights sum to zero")
        if 0 < self.syllable_inventory < 4:
            raise Invalid("syllable_inventory", "0 (open) or at least 4 syllables")

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> WorldConfig:
        """A shipped world preset (`organism`, `hard`, `theorem`: `configs/world-NAME.yaml`) with
        overrides."""
        return load_world_config(f"world-{name}", overrides)

    def validate(self) -> None:
        """The checks again, after fields were assigned one by one."""
        check(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, where: str = "world") -> WorldConfig:
        """Inverse of `to_dict` (as stored in world.json); unknown keys are an error naming
        `where`."""
        return validate(cls, data, source=where)

    def to_dict(self) -> dict[str, Any]:
        """The world.json form: relations as a list, hop counts as text keys."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(WorldConfig)}
        out["relations"] = list(self.relations)
        out["hop_mix"] = {str(k): v for k, v in sorted(self.hop_mix.items())}
        return out


@section
class MakeWorldConfig(WorldConfig):
    """`llds world`: a world's settings and the folder its files go to."""

    out: str = ""
    """output folder for corpus.jsonl, train.jsonl, test.jsonl and world.json; required"""

    def missing(self) -> list[tuple[str, str]]:
        """Required keys left empty."""
        return [("out", "required (the output folder)")] if not self.out else []

    def world(self) -> WorldConfig:
        """The world's settings alone (what world.json records)."""
        names = (f.name for f in dataclasses.fields(WorldConfig))
        return WorldConfig(**{name: getattr(self, name) for name in names})


def load_world_config(
    path: str | Path | None = None, given: Overrides | None = None, cls: type = WorldConfig
) -> Any:
    """`WorldConfig` (or `cls`) from a YAML file or preset name (`base:` allowed) and
    overrides (`key=value` text or a mapping of values), which win."""
    return load(cls, path, given or ())


@dataclass(frozen=True)
class Entity:
    name: str
    type: str
    syllables: tuple[str, ...]
    near_duplicate_of: str | None = None

    @property
    def reference(self) -> str:
        """How text refers to the entity ("the Talun river", "the Dral", "Kelmora")."""
        if self.type == "river":
            return f"the {self.name} river"
        if self.type == "currency":
            return f"the {self.name}"
        return self.name

    @property
    def aliases(self) -> tuple[str, ...]:
        return (self.name, f"{self.name} river") if self.type == "river" else (self.name,)


@dataclass
class World:
    config: WorldConfig
    entities: list[Entity]
    facts: dict[tuple[str, str], str]  # (subject name, relation) -> object name
    fact_doc: dict[tuple[str, str], str]  # (subject name, relation) -> gold passage id
    corpus: list[dict[str, str]]  # Search-R1 corpus rows: {"id", "contents"}
    train: list[QAExample]
    test: list[QAExample]
    available_chains: dict[int, int]

    def stats(self) -> dict[str, Any]:
        def by_hops(examples: Sequence[QAExample]) -> dict[str, int]:
            counts = Counter(ex.metadata["hops"] for ex in examples)
            return {str(h): counts[h] for h in sorted(counts)}

        return {
            "entities": len(self.entities),
            "entities_by_type": dict(Counter(e.type for e in self.entities)),
            "near_duplicate_names": sum(e.near_duplicate_of is not None for e in self.entities),
            "facts": len(self.facts),
            "passages": len(self.corpus),
            "distractor_passages": len(self.corpus) - len(self.facts),
            "train": len(self.train),
            "test": len(self.test),
            "train_by_hops": by_hops(self.train),
            "test_by_hops": by_hops(self.test),
            "available_chains_by_hops": {
                str(h): n for h, n in sorted(self.available_chains.items())
            },
        }


# ----------------------------------------------------------------------------------------- names


def _template_words() -> set[str]:
    words: set[str] = set(_THINGS)
    texts = [t for r in RELATIONS.values() for t in (*r.passages, *r.questions, r.phrase)]
    texts += [t for bank in _DISTRACTORS.values() for t in bank]
    for text in texts:
        words.update(w.strip(".,?{}").lower() for w in text.split())
    return words


def _random_syllable(rng: random.Random, final: bool) -> str:
    vowels, codas = (_FINAL_VOWELS, _FINAL_CODAS) if final else (_VOWELS, _CODAS)
    return rng.choice(_ONSETS) + rng.choice(vowels) + rng.choice(codas)


def _similar(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """True when two names share all but one syllable, or one name starts with the other."""
    sa, sb = "".join(a), "".join(b)
    if sa.startswith(sb) or sb.startswith(sa):
        return True
    return len(a) == len(b) and sum(x != y for x, y in zip(a, b, strict=True)) <= 1


def _closed_inventory(rng: random.Random, size: int) -> tuple[str, ...]:
    """`size` distinct syllables every name is built from. Final-position shapes (vowel a/o/u,
    coda n/r/k/m or none) are used everywhere, so any order of them ends no name in a suffix an
    English stemmer strips."""
    pool = sorted({o + v + c for o in _ONSETS for v in _FINAL_VOWELS for c in _FINAL_CODAS})
    if size > len(pool):
        raise ConfigError(f"world.syllable_inventory: at most {len(pool)} syllables, got {size}")
    return tuple(rng.sample(pool, size))


class _NameMaker:
    """Draws unique names; near-duplicates only when asked for (with `name_similarity`) or
    when every name comes from one small shared syllable inventory."""

    def __init__(
        self,
        rng: random.Random,
        similarity: float,
        inventory: tuple[str, ...] = (),
        length: int = 0,
    ) -> None:
        self.rng = rng
        self.similarity = similarity
        self.inventory = inventory
        self.length = length
        self.taken: dict[str, tuple[str, ...]] = {}
        self.by_type: dict[str, list[str]] = {}
        self.banned = _template_words()

    def _free(self, syl: tuple[str, ...]) -> bool:
        name = "".join(syl)
        return (
            name not in self.banned
            and name not in self.taken
            and not name.endswith(_STEMMED_ENDINGS)
        )

    def _far(self, syl: tuple[str, ...]) -> bool:
        if self.inventory:  # shared pieces are the point; only a prefix would be ambiguous
            name = "".join(syl)
            return all(
                not (name.startswith(o) or o.startswith(name))
                for o in map("".join, self.taken.values())
            )
        return all(not _similar(syl, other) for other in self.taken.values())

    def _syllable(self, final: bool) -> str:
        if self.inventory:
            return self.rng.choice(self.inventory)
        return _random_syllable(self.rng, final=final)

    def _near_duplicate(self, etype: str) -> tuple[tuple[str, ...], str] | None:
        pool = self.by_type.get(etype) or [n for names in self.by_type.values() for n in names]
        for _ in range(50):
            if not pool:
                return None
            base = self.rng.choice(pool)
            syl = list(self.taken[base])
            pos = self.rng.randrange(len(syl))
            syl[pos] = self._syllable(final=pos == len(syl) - 1)
            cand = tuple(syl)
            if cand != self.taken[base] and self._free(cand):
                return cand, base
        return None

    def new(self, etype: str) -> Entity:
        near = self._near_duplicate(etype) if self.rng.random() < self.similarity else None
        if near is not None:
            syl, base = near
        else:
            base = None
            for _ in range(10_000):
                n = self.length or self.rng.choice((2, 2, 2, 3))
                syl = tuple(self._syllable(final=i == n - 1) for i in range(n))
                if self._free(syl) and self._far(syl):
                    break
            else:  # pragma: no cover - the inventory holds far more names than any config asks
                raise ConfigError("world.num_entities: ran out of distinct names")
        name = "".join(syl)
        self.taken[name] = syl
        self.by_type.setdefault(etype, []).append(name)
        return Entity(name.capitalize(), etype, syl, base.capitalize() if base else None)


# ---------------------------------------------------------------------------------------- facts


def _type_counts(n: int) -> dict[str, int]:
    raw = {t: n * s for t, s in _TYPE_SHARES.items()}
    counts = {t: max(2, int(v)) for t, v in raw.items()}
    rest = n - sum(counts.values())
    for t in sorted(raw, key=lambda t: raw[t] - int(raw[t]), reverse=True)[: max(rest, 0)]:
        counts[t] += 1
    return counts


def _assign_facts(
    rng: random.Random, by_type: Mapping[str, list[Entity]], relations: Sequence[str]
) -> dict[tuple[str, str], str]:
    """One object per (subject, relation); capitals are injective, other objects spread evenly."""
    facts: dict[tuple[str, str], str] = {}
    for rel_name in relations:
        rel = RELATIONS[rel_name]
        subjects, objects = by_type[rel.subject_type], by_type[rel.object_type]
        if rel_name == "capital" and len(objects) >= len(subjects):
            chosen = rng.sample(objects, len(subjects))
        else:  # every object used about equally often, then shuffled
            pool = [objects[i % len(objects)] for i in range(len(subjects))]
            rng.shuffle(pool)
            chosen = pool
        for subj, obj in zip(subjects, chosen, strict=True):
            facts[(subj.name, rel_name)] = obj.name
    return facts


def _sentence(template: str, **refs: str) -> str:
    text = template.format(**refs)
    return text[0].upper() + text[1:]


def _build_corpus(
    rng: random.Random,
    cfg: WorldConfig,
    entities: Sequence[Entity],
    facts: Mapping[tuple[str, str], str],
) -> tuple[list[dict[str, str]], dict[tuple[str, str], str]]:
    by_name = {e.name: e for e in entities}
    docs: list[tuple[str, str, tuple[str, str] | None]] = []  # (title, text, fact key)
    for (subj_name, rel_name), obj_name in facts.items():
        rel = RELATIONS[rel_name]
        template = rng.choice(rel.passages[: cfg.passage_templates_per_relation])
        subj, obj = by_name[subj_name], by_name[obj_name]
        docs.append(
            (
                subj.name,
                _sentence(template, s=subj.reference, o=obj.reference),
                (subj_name, rel_name),
            )
        )
    for ent in entities:
        bank = _DISTRACTORS[ent.type]
        for _ in range(cfg.distractors_per_entity):
            text = _sentence(rng.choice(bank), s=ent.reference, thing=rng.choice(_THINGS))
            docs.append((ent.name, text, None))
    rng.shuffle(docs)
    corpus, fact_doc = [], {}
    for i, (title, text, key) in enumerate(docs):
        doc_id = str(i)
        corpus.append({"id": doc_id, "contents": f'"{title}"\n{text}'})
        if key is not None:
            fact_doc[key] = doc_id
    return corpus, fact_doc


# ------------------------------------------------------------------------------------- questions


def _enumerate_chains(
    entities: Sequence[Entity],
    facts: Mapping[tuple[str, str], str],
    relations: Sequence[str],
    hops: int,
) -> list[tuple[str, tuple[str, ...]]]:
    """All (start, relation path) of length `hops` whose entities are pairwise distinct."""
    out_rels: dict[str, list[str]] = {}
    for subj, rel in facts:
        out_rels.setdefault(subj, []).append(rel)
    chains: list[tuple[str, tuple[str, ...]]] = []

    def extend(start: str, path: tuple[str, ...], seen: tuple[str, ...]) -> None:
        if len(path) == hops:
            chains.append((start, path))
            return
        for rel in sorted(out_rels.get(seen[-1], []), key=relations.index):
            nxt = facts[(seen[-1], rel)]
            if nxt not in seen:
                extend(start, (*path, rel), (*seen, nxt))

    for ent in entities:
        extend(ent.name, (), (ent.name,))
    return chains


def _question_text(rng: random.Random, cfg: WorldConfig, start: Entity, path: Sequence[str]) -> str:
    ref = start.reference
    for rel_name in path[:-1]:
        ref = RELATIONS[rel_name].phrase.format(x=ref)
    last = RELATIONS[path[-1]]
    return _sentence(rng.choice(last.questions[: cfg.question_templates_per_relation]), x=ref)


def _split_counts(total: int, mix: Mapping[int, float]) -> dict[int, int]:
    """Largest-remainder rounding of `total * share` per hop count (sums exactly to total)."""
    weight = sum(mix.values())
    raw = {int(h): total * w / weight for h, w in mix.items()}
    counts = {h: int(v) for h, v in raw.items()}
    order = sorted(raw, key=lambda h: (raw[h] - counts[h], -h), reverse=True)
    for h in order[: total - sum(counts.values())]:
        counts[h] += 1
    return counts


def _make_examples(
    rng: random.Random,
    cfg: WorldConfig,
    entities: Sequence[Entity],
    facts: Mapping[tuple[str, str], str],
    fact_doc: Mapping[tuple[str, str], str],
) -> tuple[list[QAExample], list[QAExample], dict[int, int]]:
    by_name = {e.name: e for e in entities}
    n_train = _split_counts(cfg.num_train, cfg.hop_mix)
    n_test = _split_counts(cfg.num_test, cfg.hop_mix)
    rows: dict[str, list[dict[str, Any]]] = {"train": [], "test": []}
    available: dict[int, int] = {}
    for hops in sorted(n_train):
        chains = _enumerate_chains(entities, facts, cfg.relations, hops)
        available[hops] = len(chains)
        need = n_train[hops] + n_test[hops]
        if need > len(chains):
            raise ConfigError(
                f"world: {need} questions with {hops} hop(s) requested (train+test) but the world "
                f"has only {len(chains)} distinct {hops}-hop chains; raise world.num_entities or "
                "lower num_train/num_test/hop_mix"
            )
        picked = rng.sample(chains, need)
        for split, part in (("test", picked[: n_test[hops]]), ("train", picked[n_test[hops] :])):
            for start, path in part:
                rows[split].append(_question_row(rng, cfg, by_name, facts, fact_doc, start, path))
    out: dict[str, list[QAExample]] = {}
    for split, split_rows in rows.items():
        rng.shuffle(split_rows)
        out[split] = [
            QAExample(
                id=f"world:s{cfg.seed}:{split}:{i}",
                question=r["question"],
                answers=r["answers"],
                source="world",
                metadata=r["metadata"],
            )
            for i, r in enumerate(split_rows)
        ]
    return out["train"], out["test"], available


def _question_row(
    rng: random.Random,
    cfg: WorldConfig,
    by_name: Mapping[str, Entity],
    facts: Mapping[tuple[str, str], str],
    fact_doc: Mapping[tuple[str, str], str],
    start: str,
    path: Sequence[str],
) -> dict[str, Any]:
    chain, current = [], start
    for rel_name in path:
        answer = facts[(current, rel_name)]
        chain.append(
            {
                "query": f"{RELATIONS[rel_name].keyword} of {current}",
                "answer": answer,
                "doc_id": fact_doc[(current, rel_name)],
                "relation": rel_name,
                "subject": current,
            }
        )
        current = answer
    final = by_name[current]
    return {
        "question": _question_text(rng, cfg, by_name[start], path),
        "answers": final.aliases,
        "metadata": {
            "hops": len(path),
            "chain": chain,
            "start": start,
            "relations": list(path),
            "answer_type": final.type,
        },
    }


# ------------------------------------------------------------------------------------ public API


def generate_world(config: WorldConfig | None = None) -> World:
    """Build the world for `config` (default: the organism preset). Pure and deterministic."""
    cfg = config or WorldConfig()
    cfg.validate()
    rng = random.Random(cfg.seed)
    inventory = (
        _closed_inventory(random.Random(f"syllables:{cfg.seed}"), cfg.syllable_inventory)
        if cfg.syllable_inventory
        else ()
    )
    names = _NameMaker(rng, cfg.name_similarity, inventory, cfg.name_length)
    counts = _type_counts(cfg.num_entities)
    by_type: dict[str, list[Entity]] = {t: [] for t in ENTITY_TYPES}
    for etype in ENTITY_TYPES:
        for _ in range(counts[etype]):
            by_type[etype].append(names.new(etype))
    entities = [e for t in ENTITY_TYPES for e in by_type[t]]
    facts = _assign_facts(rng, by_type, cfg.relations)
    corpus, fact_doc = _build_corpus(rng, cfg, entities, facts)
    train, test, available = _make_examples(rng, cfg, entities, facts, fact_doc)
    return World(cfg, entities, facts, fact_doc, corpus, train, test, available)


def relabel_world(world: World, seed: int) -> World:
    """The same world with entity names permuted within each type (a new set of facts).

    Why: a tiny model warm-started on one world can memorize its facts instead of learning to
    copy names from the question and the passages. Relabeled copies keep every name, template
    and chain shape but attach the names to different facts, so the only strategy that works on
    all copies is reading: it is name-permutation augmentation for the warm start. The copy
    shares the vocabulary of the original (a tokenizer fitted on one fits both), questions get
    ids suffixed `:perm{seed}`, and every chain stays answerable from the relabeled corpus.
    """
    rng = random.Random(f"relabel:{seed}")
    mapping: dict[str, str] = {}
    for etype in ENTITY_TYPES:
        names = [e.name for e in world.entities if e.type == etype]
        shuffled = names[:]
        rng.shuffle(shuffled)
        mapping.update(zip(names, shuffled, strict=True))
    if not mapping:
        return world
    pattern = re.compile(
        r"\b(" + "|".join(map(re.escape, sorted(mapping, key=len, reverse=True))) + r")\b"
    )

    def text(s: str) -> str:
        return pattern.sub(lambda m: mapping[m.group(1)], s)

    def value(v: Any) -> Any:
        if isinstance(v, str):
            return text(v)
        if isinstance(v, list | tuple):
            return type(v)(value(x) for x in v)
        if isinstance(v, dict):
            return {k: value(x) for k, x in v.items()}
        return v

    facts = {(mapping[s], r): mapping[o] for (s, r), o in world.facts.items()}
    fact_doc = {(mapping[s], r): d for (s, r), d in world.fact_doc.items()}
    corpus = [{**row, "contents": text(row["contents"])} for row in world.corpus]

    def example(ex: QAExample) -> QAExample:
        return replace(
            ex,
            id=f"{ex.id}:perm{seed}",
            question=text(ex.question),
            answers=value(ex.answers),
            metadata=value(ex.metadata),
        )

    # the entities (names, types, syllables) are the same set: only the facts moved
    return World(
        world.config,
        list(world.entities),
        facts,
        fact_doc,
        corpus,
        [example(ex) for ex in world.train],
        [example(ex) for ex in world.test],
        dict(world.available_chains),
    )


def read_world(folder: str | Path) -> World:
    """The `World` a folder from `write_world` holds, regenerated from its world.json config.

    Generation is deterministic, so the config is the whole world; the folder's corpus.jsonl is
    checked against the regenerated one so an edited folder is reported instead of silently
    replaced.
    """
    import json

    from llds.retrieval.corpus import read_corpus

    folder = Path(folder)
    meta_path, corpus_path = folder / "world.json", folder / "corpus.jsonl"
    if not meta_path.is_file() or not corpus_path.is_file():
        raise UserInputError(
            f"{folder}: not a world folder (needs world.json and corpus.jsonl; "
            "create one with `llds world --out DIR`)"
        )
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise UserInputError(f"{meta_path}: not valid JSON ({err})") from err
    if not isinstance(meta, dict) or not isinstance(meta.get("config"), dict):
        raise UserInputError(f"{meta_path}: no 'config' object (not written by `llds world`?)")
    world = generate_world(WorldConfig.from_dict(meta["config"], where=str(meta_path)))
    on_disk = [(p.id, p.contents) for p in read_corpus(corpus_path)]
    if on_disk != [(d["id"], d["contents"]) for d in world.corpus]:
        raise UserInputError(
            f"{corpus_path}: differs from the world its world.json describes "
            "(edited by hand, or written by another version)"
        )
    return world


def flashrag_row(ex: QAExample) -> dict[str, Any]:
    """One question as a FlashRAG jsonl row (what `load_examples` reads back)."""
    return {
        "id": ex.id,
        "question": ex.question,
        "golden_answers": list(ex.answers),
        "data_source": ex.source,
        "metadata": ex.metadata,
    }


def write_world(world: World, out_dir: str | Path) -> dict[str, Path]:
    """Write corpus.jsonl, train.jsonl, test.jsonl (FlashRAG rows) and world.json atomically."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {name: out / f"{name}.jsonl" for name in ("corpus", "train", "test")}
    write_jsonl(paths["corpus"], world.corpus)
    write_jsonl(paths["train"], (flashrag_row(ex) for ex in world.train))
    write_jsonl(paths["test"], (flashrag_row(ex) for ex in world.test))
    paths["world"] = out / "world.json"
    write_json(
        paths["world"],
        {"format": "llds-world/1", "config": world.config.to_dict(), "stats": world.stats()},
    )
    return paths
