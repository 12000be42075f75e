"""Synthetic discharge summaries with gold codes, deterministic by seed (demo profile).

Each note is one admission of one patient, lower-cased and unpunctuated like the
preprocessed MIMIC-IV text (App. A), laid out in MIMIC's section order.  It is
built so that coding it is learnable by a tiny model and still has near-misses:

* every gold code's description appears verbatim in the hospital course, and
  again, lightly paraphrased (a small synonym table), in the history or the
  past medical history;
* category siblings of gold codes are often named as ruled-out alternatives
  ("no evidence of ...", "... was ruled out"), so a P2C decision between a code
  and its sibling exists in the text;
* distractors: normal exam findings, results and denied conditions (other
  inventory codes, negated);
* the discharge-diagnosis section lists the gold descriptions, as real notes
  do; App. A's corpus rule cuts it before the note enters a prompt.

Codes are drawn with a Zipf-like prior over categories (a seeded permutation
fixes which are common), so frequent and rare labels exist as in MIMIC-IV.
One patient has one note, except a share of patients with a second admission
(carrying over about half of the first admission's codes), so the corpus rules'
one-note-per-patient constraint matters.  Patients, not notes, are assigned to
train / val / test splits, as Edin et al.'s splits are.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

from mistill.errors import UserError
from mistill.world.inventory import Inventory
from mistill.world.types import Note

# Light paraphrase: longer keys first so "malignant neoplasm" wins over "neoplasm".
SYNONYMS: dict[str, tuple[str, ...]] = {
    "malignant neoplasm": ("cancer", "malignancy"),
    "benign neoplasm": ("benign tumor", "benign growth"),
    "diabetes mellitus": ("diabetes",),
    "hypertension": ("high blood pressure", "htn"),
    "neoplasm": ("tumor", "mass"),
    "kidney": ("renal",),
    "renal": ("kidney",),
    "hepatic": ("liver",),
    "liver": ("hepatic",),
    "heart": ("cardiac",),
    "cardiac": ("heart",),
    "lung": ("pulmonary",),
    "pulmonary": ("lung",),
    "gastric": ("stomach",),
    "cerebral": ("brain",),
    "hemorrhage": ("bleeding", "bleed"),
    "failure": ("insufficiency",),
    "disease": ("disorder", "illness"),
    "disorder": ("condition", "disease"),
    "infection": ("infectious process",),
    "fracture": ("break",),
    "pain": ("discomfort",),
    "obstruction": ("blockage",),
    "unspecified": ("not otherwise specified", "nos"),
    "acute": ("new onset",),
    "chronic": ("longstanding", "long term"),
    "congenital": ("inborn",),
    "syndrome": ("presentation",),
    "other": ("another",),
    "without": ("with no",),
    "inflammation": ("swelling",),
    "abscess": ("collection",),
}
_SYNONYM_RE = re.compile(r"\b(" + "|".join(sorted(SYNONYMS, key=len, reverse=True)) + r")\b")

# MIMIC-IV discharge summaries' section order; `corpora.KNOWN_SECTION_HEADERS` reads the same names.
SECTIONS = (
    "chief complaint", "history of present illness", "past medical history", "social history",
    "physical exam", "pertinent results", "brief hospital course", "discharge medications",
    "discharge disposition", "discharge diagnosis", "discharge condition", "discharge instructions",
    "followup instructions",
)

SERVICES = ("medicine", "surgery", "neurology", "cardiology", "orthopaedics", "obstetrics")
ALLERGIES = ("no known allergies adverse drug reactions", "penicillins", "sulfa antibiotics", "codeine")
SOCIAL = ("lives with spouse", "lives alone", "retired teacher", "former smoker quit years ago",
          "denies alcohol use", "works in construction", "lives with daughter")
EXAM_FINDINGS = (
    "alert and oriented times three", "no acute distress", "lungs clear to auscultation bilaterally",
    "regular rate and rhythm no murmurs", "abdomen soft nontender nondistended", "no peripheral edema",
    "pupils equal round and reactive to light", "moves all extremities", "skin warm and dry",
    "mucous membranes moist", "neck supple no lymphadenopathy", "bowel sounds present",
    "gait steady", "sensation intact to light touch", "extraocular movements intact",
)
RESULTS = (
    "white count within normal limits", "hemoglobin stable", "electrolytes unremarkable",
    "chest radiograph without acute process", "urinalysis negative", "blood cultures no growth",
    "lactate normal", "coagulation studies within normal limits", "troponin negative",
    "liver function tests unremarkable", "creatinine at baseline", "glucose well controlled",
)
COURSE_GOLD = (
    "patient was found to have {d}", "{d} was diagnosed and treated", "{d} was managed medically",
    "workup confirmed {d}", "treated for {d} with good response", "{d} was addressed during admission",
)
COURSE_RULED_OUT = (
    "no evidence of {d}", "{d} was ruled out", "workup negative for {d}", "doubt {d}",
    "initially concerning for {d} but this was excluded",
)
HISTORY_GOLD = ("history of {p}", "known {p}", "presents with {p}", "with {p}")
DENIED = ("denies {d}", "no history of {d}", "negative for {d}")
MEDICATIONS = ("acetaminophen", "aspirin", "metoprolol", "lisinopril", "atorvastatin", "metformin",
               "furosemide", "omeprazole", "heparin", "insulin", "amoxicillin", "prednisone")
DISPOSITIONS = ("home", "home with service", "extended care facility", "rehabilitation facility")
CONDITION = ("mental status clear and coherent level of consciousness alert and interactive "
             "activity status ambulatory independent")
INSTRUCTIONS = (
    "you were admitted to the hospital and treated please take your medications as prescribed",
    "please return to the emergency department if your symptoms worsen",
    "please keep your followup appointments",
)
FOLLOWUP = ("followup with your primary care physician in one week", "followup in clinic in two weeks")


@dataclass(frozen=True)
class NoteGeneratorConfig:
    n_patients: int = 440
    second_note_share: float = 0.1
    min_gold: int = 3
    max_gold: int = 10
    split_shares: dict[str, float] = field(
        default_factory=lambda: {"train": 0.7, "val": 0.05, "test": 0.25})
    zipf_exponent: float = 0.8          # category prior: weight of rank r is 1 / (r + 1) ** exponent
    sibling_mention_prob: float = 0.6   # per gold code with siblings: name one sibling as ruled out
    paraphrase_prob: float = 0.5        # per word with a synonym, in the paraphrased mention
    denied_mentions: tuple[int, int] = (1, 4)
    exam_findings: tuple[int, int] = (3, 8)
    results: tuple[int, int] = (2, 6)
    carry_over_share: float = 0.5       # of a first admission's codes, on a patient's second note

    @classmethod
    def from_params(cls, params: dict) -> NoteGeneratorConfig:
        known = {k: v for k, v in params.items() if k in cls.__dataclass_fields__}
        for key in ("denied_mentions", "exam_findings", "results"):
            if key in known:
                known[key] = tuple(known[key])
        config = cls(**known)
        config.check()
        return config

    def check(self) -> None:
        if not 1 <= self.min_gold <= self.max_gold:
            raise UserError(f"notes: need 1 <= min_gold <= max_gold, got {self.min_gold}, {self.max_gold}")
        if self.n_patients < 1:
            raise UserError(f"notes: n_patients must be positive, got {self.n_patients}")
        if not 0 <= self.second_note_share <= 1:
            raise UserError(f"notes: second_note_share must lie in [0, 1], got {self.second_note_share}")
        if abs(sum(self.split_shares.values()) - 1) > 1e-9 or min(self.split_shares.values()) < 0:
            raise UserError(f"notes: split_shares must be non-negative and sum to 1, got {self.split_shares}")


def paraphrase(description: str, rng: random.Random, prob: float) -> str:
    """Replace words or phrases of the synonym table, each with probability `prob`."""
    def swap(match: re.Match) -> str:
        if rng.random() >= prob:
            return match.group(0)
        return rng.choice(SYNONYMS[match.group(0)])
    return _SYNONYM_RE.sub(swap, description)


class _Generator:
    def __init__(self, inventory: Inventory, config: NoteGeneratorConfig, seed: int):
        self.inventory = inventory
        self.config = config
        self.rng = random.Random(seed)
        # The category prior is fixed by a seeded permutation of the sorted categories,
        # so it does not depend on the inventory's shared order.
        categories = sorted(inventory.categories())
        self.rng.shuffle(categories)
        self.categories = categories
        self.category_weights = [1 / (rank + 1) ** config.zipf_exponent for rank in range(len(categories))]
        self.all_codes = sorted(inventory.codes)

    def _draw_gold(self, n: int, keep: list[str]) -> list[str]:
        gold = list(keep)
        used = {self.inventory[c].category for c in gold}
        n = min(n, len(self.categories))
        while len(gold) < n:
            category = self.rng.choices(self.categories, weights=self.category_weights)[0]
            if category in used:
                continue
            used.add(category)
            codes = sorted(self.inventory.categories()[category])
            gold.append(codes[min(int(self.rng.expovariate(1.0)), len(codes) - 1)])
        return gold

    def _sample(self, pool, bounds: tuple[int, int]) -> list[str]:
        low, high = bounds
        return self.rng.sample(pool, min(len(pool), self.rng.randint(low, high)))

    def _text(self, gold: list[str]) -> str:
        rng, cfg, inv = self.rng, self.config, self.inventory
        desc = {c: inv[c].description for c in gold}
        gold_categories = {inv[c].category for c in gold}
        ruled_out = []
        for code in gold:
            siblings = [s for s in inv.siblings(code) if s not in gold]
            if siblings and rng.random() < cfg.sibling_mention_prob:
                ruled_out.append(rng.choice(sorted(siblings)))
        others = [c for c in self.all_codes if inv[c].category not in gold_categories]
        denied = self._sample(others, cfg.denied_mentions)

        history_codes = rng.sample(gold, max(1, len(gold) // 2))
        past_codes = [c for c in gold if c not in history_codes]
        age = rng.choice(("twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty"))
        sex, sex_letter = rng.choice((("man", "m"), ("woman", "f")))
        course = [rng.choice(COURSE_GOLD).format(d=desc[c]) for c in gold]
        course += [rng.choice(COURSE_RULED_OUT).format(d=inv[c].description) for c in ruled_out]
        rng.shuffle(course)

        def para(code: str) -> str:
            return paraphrase(desc[code], rng, cfg.paraphrase_prob)

        sections = {
            "chief complaint": para(gold[0]),
            "history of present illness": " ".join(
                [f"{age} year old {sex}"]
                + [rng.choice(HISTORY_GOLD).format(p=para(c)) for c in history_codes]
                + [rng.choice(DENIED).format(d=inv[c].description) for c in denied]),
            "past medical history": " ".join(para(c) for c in past_codes) or "none",
            "social history": rng.choice(SOCIAL),
            "physical exam": " ".join(self._sample(EXAM_FINDINGS, cfg.exam_findings)),
            "pertinent results": " ".join(self._sample(RESULTS, cfg.results)),
            "brief hospital course": " ".join(course),
            "discharge medications": " ".join(self._sample(MEDICATIONS, (2, 6))),
            "discharge disposition": rng.choice(DISPOSITIONS),
            "discharge diagnosis": "primary " + desc[gold[0]]
                                   + ((" secondary " + " ".join(desc[c] for c in gold[1:])) if gold[1:] else ""),
            "discharge condition": CONDITION,
            "discharge instructions": " ".join(INSTRUCTIONS),
            "followup instructions": rng.choice(FOLLOWUP),
        }
        opening = (f"name unit no admission date discharge date date of birth sex {sex_letter} "
                   f"service {rng.choice(SERVICES)} allergies {rng.choice(ALLERGIES)} attending")
        return " ".join([opening] + [f"{name} {sections[name]}" for name in SECTIONS])

    def patients(self) -> list[Note]:
        cfg = self.config
        splits, shares = zip(*sorted(cfg.split_shares.items()))
        notes: list[Note] = []
        for index in range(cfg.n_patients):
            patient = f"p{index:05d}"
            split = self.rng.choices(splits, weights=shares)[0]
            n_notes = 2 if self.rng.random() < cfg.second_note_share else 1
            previous: list[str] = []
            for admission in range(n_notes):
                keep = self.rng.sample(previous, int(len(previous) * cfg.carry_over_share)) if previous else []
                gold = self._draw_gold(self.rng.randint(cfg.min_gold, cfg.max_gold), keep)
                note_id = f"n{index:05d}-{admission}"
                notes.append(Note(note_id, patient, self._text(gold), tuple(gold), split,
                                  {"source_split": split}))
                previous = gold
        return notes


def generate_notes(inventory: Inventory, config: NoteGeneratorConfig, seed: int) -> list[Note]:
    """The demo note pool: one or two notes per patient, gold codes from `inventory`.

    Deterministic given (inventory codes, config, seed).  `split` is the
    patient's source split (train / val / test), also kept as `source_split`.
    """
    config.check()
    return _Generator(inventory, config, seed).patients()
