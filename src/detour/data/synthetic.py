"""SYNTHETIC clinical case reports: the embedded default corpus for a machine with no data.

    python -m detour.data.synthetic --n 2 --seed 0 --lang en
    detour prepare "synthetic:clinical?docs=3000&seed=0" --tokenizer <model folder> --out data/synthetic

Every document is generated from templates and the lexicons in `detour.data.lexicons` (re-exported
here: DRUGS, ROUTES, DIAGNOSES, ...). Document i depends only on (seed, lang, i), so any slice of
the corpus can be regenerated independently. The text is synthetic: it never stands in for real
data in a claimed result, and `detour prepare` marks it so in its manifest and its output.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Iterator

from detour.data.lexicons import (  # noqa: F401  (re-exported for the needle probe)
    ALLERGIES,
    COMORBIDITIES,
    DIAGNOSES,
    DRUGS,
    DURATIONS,
    FREQUENCIES,
    LAB_TESTS,
    OCCUPATIONS,
    OUTCOMES,
    PROCEDURES,
    ROUTES,
    SETTINGS,
    SYMPTOMS,
    VITAL_SIGNS,
)
from detour.errors import DetourError

LANGS = ("en", "fr")


def generate_documents(n: int, seed: int = 0, lang: str = "en") -> Iterator[str]:
    """Yield `n` synthetic clinical case reports (multi-paragraph, about 150-600 words each)."""
    if lang not in LANGS:
        raise DetourError(f"synthetic corpus: unknown lang {lang!r} (choose from {', '.join(LANGS)})")
    if n < 0:
        raise DetourError(f"synthetic corpus: docs must be >= 0, got {n}")
    for i in range(n):
        yield generate_document(i, seed, lang)


def generate_document(i: int, seed: int = 0, lang: str = "en") -> str:
    # A string seed is hashed with SHA-512 by `random`: stable across runs and platforms.
    rng = random.Random(f"detour-synthetic:{lang}:{seed}:{i}")
    case = _draw_case(rng)
    writer = _English(rng, case) if lang == "en" else _French(rng, case)
    return "\n\n".join(p for p in writer.paragraphs() if p)


# ---- the facts of one case (language independent) ----

def _value(rng: random.Random, lo: float, hi: float, decimals: int) -> str:
    x = rng.uniform(lo, hi)
    return f"{x:.{decimals}f}" if decimals else str(int(round(x)))


def _lab(rng: random.Random, name: str, direction: str | None) -> tuple[str, str, str]:
    spec = LAB_TESTS[name]
    lo, hi = spec["normal"]
    if direction == "high":
        lo, hi = hi * 1.2, hi * rng.choice((1.6, 2.5, 5.0))
    elif direction == "low":
        lo, hi = lo * rng.choice((0.4, 0.6)), lo * 0.9
    return name, _value(rng, lo, hi, spec["decimals"]), direction or "normal"


def _vital(rng: random.Random, name: str, direction: str | None) -> tuple[str, str, str]:
    spec = VITAL_SIGNS[name]
    lo, hi = spec[direction] if direction in ("low", "high") else spec["normal"]
    return name, _value(rng, lo, hi, 1 if name == "temperature" else 0), direction or "normal"


def _prescription(rng: random.Random, drug: str) -> dict:
    spec = DRUGS[drug]
    dose = rng.choice(spec["doses"])
    unit_of_time = rng.choice(("days", "days", "weeks"))
    lo, hi = DURATIONS[unit_of_time]["range"]
    return {
        "drug": drug, "dose": f"{dose:g}", "unit": spec["unit"], "route": rng.choice(spec["routes"]),
        "frequency": rng.choice(tuple(FREQUENCIES)), "duration": (rng.randint(lo, hi), unit_of_time),
    }


def _draw_case(rng: random.Random) -> dict:
    dx_name = rng.choice(tuple(DIAGNOSES))
    dx = DIAGNOSES[dx_name]
    others = [d for d in DIAGNOSES if d != dx_name]
    symptoms = rng.sample(dx["symptoms"], rng.randint(min(2, len(dx["symptoms"])), len(dx["symptoms"])))
    if rng.random() < 0.3:
        symptoms.append(rng.choice([s for s in SYMPTOMS if s not in symptoms]))
    normal_labs = rng.sample([t for t in LAB_TESTS if t not in dx["labs"]], rng.randint(2, 6))
    labs = [_lab(rng, t, d) for t, d in dx["labs"].items()] + [_lab(rng, t, None) for t in normal_labs]
    rng.shuffle(labs)
    vitals = [_vital(rng, v, dx["vitals"].get(v)) for v in VITAL_SIGNS if v in dx["vitals"] or rng.random() < 0.7]
    drugs = rng.sample(dx["drugs"], rng.randint(1, min(3, len(dx["drugs"]))))
    home_drugs = rng.sample([d for d in DRUGS if d not in drugs], rng.randint(0, 3))
    duration_unit = rng.choice(("hours", "days", "days", "weeks", "months"))
    lo, hi = DURATIONS[duration_unit]["range"]
    return {
        "age": rng.randint(18, 94), "sex": rng.choice(("male", "female")),
        "occupation": rng.choice(tuple(OCCUPATIONS)) if rng.random() < 0.5 else None,
        "setting": rng.choice(tuple(SETTINGS)), "onset": (rng.randint(lo, hi), duration_unit),
        "diagnosis": dx_name, "differential": rng.sample(others, rng.randint(1, 3)),
        "symptoms": symptoms, "labs": labs, "vitals": vitals,
        "comorbidities": rng.sample(tuple(COMORBIDITIES), rng.randint(0, 4)),
        "home": [_prescription(rng, d) for d in home_drugs],
        "allergy": (lambda a: (a, rng.choice(ALLERGIES[a])))(rng.choice(tuple(ALLERGIES))) if rng.random() < 0.35 else None,
        "smoker": rng.choice((None, "current", "former", "never")), "pack_years": rng.randint(5, 60),
        "procedures": rng.sample(dx["procedures"], rng.randint(1, len(dx["procedures"]))),
        "imaging": dx["imaging"], "treatment": [_prescription(rng, d) for d in drugs],
        "outcome": rng.choice(tuple(OUTCOMES)), "stay": rng.randint(2, 21),
        "follow_up": (rng.randint(1, 12), rng.choice(("weeks", "months"))), "discussion": rng.random() < 0.4, "course": rng.random() < 0.7,
    }


def _join(items: list[str], last: str) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + f" {last} " + items[-1]


# ---- writers: one per language, each turning a case into paragraphs ----

class _English:
    def __init__(self, rng: random.Random, case: dict):
        self.rng, self.c = rng, case

    def pick(self, *options: str) -> str:
        return self.rng.choice(options)

    def rx(self, p: dict, with_duration: bool = True) -> str:
        text = f"{p['drug']} {p['dose']} {p['unit']} {ROUTES[p['route']]['adverb']} {p['frequency']}"
        return text + (f" for {p['duration'][0]} {p['duration'][1]}" if with_duration else "")

    def paragraphs(self) -> list[str]:
        return [self.title(), self.presentation(), self.history(), self.examination(),
                self.workup(), self.treatment(), self.course(), self.outcome(), self.discussion()]

    def title(self) -> str:
        return self.pick("Case report", "Clinical case", "Case presentation", "Case summary") + (
            f": {self.c['diagnosis']}" if self.rng.random() < 0.3 else "")

    def presentation(self) -> str:
        c = self.c
        who = f"A {c['age']}-year-old {c['sex']}" + (f" {c['occupation']}" if c["occupation"] else "")
        onset = f"{c['onset'][0]}-{c['onset'][1].rstrip('s')}"
        s = [f"{who} {self.pick('presented to', 'was referred to', 'attended')} the {c['setting']} with a {onset} "
             f"history of {_join(c['symptoms'], 'and')}."]
        if self.rng.random() < 0.6:
            s.append(self.pick(
                f"The {c['symptoms'][0]} had {self.pick('worsened progressively', 'started abruptly', 'fluctuated')} "
                f"over the preceding {c['onset'][1]}.",
                f"{'He' if c['sex'] == 'male' else 'She'} denied recent travel or sick contacts.",
                f"There was no relief with {self.pick('rest', 'simple analgesia', 'over-the-counter medication')}.",
            ))
        return " ".join(s)

    def history(self) -> str:
        c = self.c
        s = []
        if c["comorbidities"]:
            s.append(f"{self.pick('Past medical history included', 'The medical history was notable for', 'Comorbidities were')} "
                     f"{_join(c['comorbidities'], 'and')}.")
        else:
            s.append(self.pick("There was no significant past medical history.", "The patient had no known comorbidities."))
        if c["home"]:
            s.append(f"Regular medications were {_join([self.rx(p, False) for p in c['home']], 'and')}.")
        if c["allergy"]:
            s.append(f"The patient reported an allergy to {c['allergy'][0]}, with {c['allergy'][1]}.")
        else:
            s.append(self.pick("No known drug allergies were recorded.", "There were no known allergies."))
        if c["smoker"] == "current":
            s.append(f"The patient was a current smoker with a {c['pack_years']} pack-year history.")
        elif c["smoker"] == "former":
            s.append(f"The patient was a former smoker ({c['pack_years']} pack-years).")
        elif c["smoker"] == "never":
            s.append("The patient had never smoked.")
        return " ".join(s)

    def examination(self) -> str:
        c = self.c
        if not c["vitals"]:
            return "On examination, vital signs were within normal limits."
        parts = [f"{name} {value} {VITAL_SIGNS[name]['unit']}" for name, value, _ in c["vitals"]]
        s = [f"On {self.pick('examination', 'arrival', 'admission')}, {_join(parts, 'and')}."]
        abnormal = [name for name, _, d in c["vitals"] if d != "normal"]
        if abnormal:
            s.append(f"The patient was {self.pick('unwell-appearing', 'uncomfortable', 'alert but distressed')}, "
                     f"with abnormal {_join(abnormal, 'and')}.")
        return " ".join(s)

    def workup(self) -> str:
        c = self.c
        def fmt(name, value):
            unit = LAB_TESTS[name]["unit"]
            return f"{name} {value}{(' ' + unit) if unit else ''}"
        abnormal = [fmt(n, v) + f" ({d})" for n, v, d in c["labs"] if d != "normal"]
        normal = [fmt(n, v) for n, v, d in c["labs"] if d == "normal"]
        s = []
        if abnormal:
            s.append(f"{self.pick('Laboratory tests showed', 'Blood tests revealed', 'Investigations showed')} {_join(abnormal, 'and')}.")
        s.append(f"{'Other results' if abnormal else 'Laboratory results'} were within normal limits: {_join(normal, 'and')}.")
        proc = c["procedures"][0]
        s.append(f"The {proc} showed {c['imaging']}." if self.rng.random() < 0.7 else f"{proc[0].upper() + proc[1:]} demonstrated {c['imaging']}.")
        s.append(f"The differential diagnosis included {_join(c['differential'], 'and')}.")
        lead = self.pick("A diagnosis of", "The final diagnosis was", "The findings were consistent with")
        s.append(f"{lead} {c['diagnosis']}{' was made' if lead == 'A diagnosis of' else ''}.")
        return " ".join(s)

    def treatment(self) -> str:
        c = self.c
        s = [f"{self.pick('The patient was started on', 'Treatment consisted of', 'Management included')} "
             f"{_join([self.rx(p) for p in c['treatment']], 'and')}."]
        if len(c["procedures"]) > 1:
            s.append(f"{_join([p for p in c['procedures'][1:]], 'and').capitalize()} "
                     f"{'was' if len(c['procedures']) == 2 else 'were'} also performed.")
        if c["allergy"] and self.rng.random() < 0.5:
            s.append(f"{c['allergy'][0].capitalize()} was avoided given the documented allergy.")
        return " ".join(s)

    def course(self) -> str:
        c = self.c
        if not c["course"]:
            return ""
        s, day = [], 1
        for name, value, direction in c["labs"]:
            if direction == "normal":
                continue
            day += self.rng.randint(1, 3)
            lo, hi = LAB_TESTS[name]["normal"]
            new = _value(self.rng, lo, hi, LAB_TESTS[name]["decimals"])
            unit = LAB_TESTS[name]["unit"]
            s.append(f"On day {day}, {name} had {'fallen' if direction == 'high' else 'risen'} from {value} to {new}"
                     f"{(' ' + unit) if unit else ''}.")
        for symptom in c["symptoms"][:2]:
            day += self.rng.randint(0, 2)
            s.append(f"The {symptom} {self.pick('resolved', 'improved', 'settled')} by day {day}.")
        if c["treatment"] and self.rng.random() < 0.5:
            p = c["treatment"][0]
            s.append(f"{p['drug'][0].upper() + p['drug'][1:]} was {self.pick('continued', 'stepped down', 'reviewed daily')} "
                     f"and the patient {self.pick('tolerated it well', 'reported no adverse effects', 'developed mild nausea')}.")
        return " ".join(s)

    def outcome(self) -> str:
        c = self.c
        return (f"The patient {c['outcome']} after {c['stay']} days. "
                f"{self.pick('At', 'On')} follow-up {c['follow_up'][0]} {c['follow_up'][1]} later, "
                f"{self.pick('the symptoms had resolved', 'there was no recurrence', 'laboratory values had normalised')}.")

    def discussion(self) -> str:
        c = self.c
        if not c["discussion"]:
            return ""
        dx = DIAGNOSES[c["diagnosis"]]
        return (f"This case illustrates that {c['diagnosis']} may present with {_join(list(dx['symptoms'][:3]), 'or')}. "
                f"Early {dx['procedures'][0]} and prompt treatment with {_join(list(dx['drugs'][:2]), 'or')} "
                f"{self.pick('are essential', 'improve outcomes', 'should be considered')}.")


class _French(_English):
    def rx(self, p: dict, with_duration: bool = True) -> str:
        unit = "unités" if p["unit"] == "units" else p["unit"]
        text = (f"{DRUGS[p['drug']]['fr']} {p['dose'].replace('.', ',')} {unit} {ROUTES[p['route']]['fr']} "
                f"{FREQUENCIES[p['frequency']]}")
        return text + (f" pendant {p['duration'][0]} {DURATIONS[p['duration'][1]]['fr']}" if with_duration else "")

    def title(self) -> str:
        return self.pick("Cas clinique", "Observation", "Présentation du cas") + (
            f" : {DIAGNOSES[self.c['diagnosis']]['fr']}" if self.rng.random() < 0.3 else "")

    def presentation(self) -> str:
        c = self.c
        who = f"{'Un patient' if c['sex'] == 'male' else 'Une patiente'} de {c['age']} ans"
        if c["occupation"]:
            who += f", {OCCUPATIONS[c['occupation']]},"
        symptoms = _join([SYMPTOMS[s] for s in c["symptoms"]], "et")
        verb = self.pick("a consulté", "a été adressé(e)", "s'est présenté(e)")
        return (f"{who} {verb} {SETTINGS[c['setting']]} pour "
                f"{symptoms} évoluant depuis {c['onset'][0]} {DURATIONS[c['onset'][1]]['fr']}.")

    def history(self) -> str:
        c = self.c
        s = [f"Antécédents : {_join([COMORBIDITIES[m] for m in c['comorbidities']], 'et')}." if c["comorbidities"]
             else "Pas d'antécédent notable."]
        if c["home"]:
            s.append(f"Traitement habituel : {_join([self.rx(p, False) for p in c['home']], 'et')}.")
        s.append(f"Allergie connue : {c['allergy'][0]}." if c["allergy"] else "Pas d'allergie connue.")
        if c["smoker"] in ("current", "former"):
            s.append(f"Tabagisme {'actif' if c['smoker'] == 'current' else 'sevré'} à {c['pack_years']} paquets-années.")
        return " ".join(s)

    def examination(self) -> str:
        c = self.c
        if not c["vitals"]:
            return "À l'examen, les constantes étaient normales."
        parts = [f"{VITAL_SIGNS[n]['fr']} {v.replace('.', ',')} {VITAL_SIGNS[n]['fr_unit']}" for n, v, _ in c["vitals"]]
        return f"À l'examen : {_join(parts, 'et')}."

    def workup(self) -> str:
        c = self.c
        labs = [f"{LAB_TESTS[n]['fr']} {v.replace('.', ',')} {LAB_TESTS[n]['unit']}".rstrip()
                + {"high": " (élevée)", "low": " (basse)", "normal": ""}[d] for n, v, d in c["labs"]]
        dx = DIAGNOSES[c["diagnosis"]]["fr"]
        finding = self.pick("anomalies compatibles", "aspect évocateur", "pas d'autre anomalie")
        return (f"Le bilan biologique retrouvait : {_join(labs, 'et')}. "
                f"{PROCEDURES[c['procedures'][0]].capitalize()} : {finding}. "
                f"Les diagnostics évoqués étaient {_join([DIAGNOSES[d]['fr'] for d in c['differential']], 'et')}. "
                f"Le diagnostic retenu était {dx}.")

    def treatment(self) -> str:
        c = self.c
        s = [f"Un traitement par {_join([self.rx(p) for p in c['treatment']], 'et')} a été instauré."]
        if len(c["procedures"]) > 1:
            s.append(f"Ont également été réalisés : {_join([PROCEDURES[p] for p in c['procedures'][1:]], 'et')}.")
        return " ".join(s)

    def outcome(self) -> str:
        c = self.c
        unit = "semaines" if c["follow_up"][1] == "weeks" else "mois"
        return (f"Le patient {OUTCOMES[c['outcome']]} après {c['stay']} jours d'hospitalisation. "
                f"Au contrôle à {c['follow_up'][0]} {unit}, l'évolution était favorable.")

    def course(self) -> str:
        c = self.c
        if not c["course"]:
            return ""
        s = [f"J{2 + k} : {LAB_TESTS[n]['fr']} en {'baisse' if d == 'high' else 'hausse'}."
             for k, (n, _, d) in enumerate(c["labs"]) if d != "normal"]
        s.append(f"Disparition de {SYMPTOMS[c['symptoms'][0]]} en {self.rng.randint(2, 6)} jours.")
        return " ".join(s)

    def discussion(self) -> str:
        c = self.c
        if not c["discussion"]:
            return ""
        dx = DIAGNOSES[c["diagnosis"]]
        return (f"Ce cas rappelle que la {dx['fr']} peut se révéler par "
                f"{_join([SYMPTOMS[s] for s in dx['symptoms'][:3]], 'ou')}.")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Print SYNTHETIC clinical case reports.")
    parser.add_argument("--n", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lang", default="en", choices=LANGS)
    args = parser.parse_args()
    for doc in generate_documents(args.n, args.seed, args.lang):
        print(doc, end="\n\n-----\n\n")
