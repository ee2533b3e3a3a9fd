"""PII text with a label per token: ai4privacy span annotations or a seeded Faker generator.

Labels are ai4privacy pii-masking-400k's 17 public classes (`PII_LABELS`), None (null in
Parquet) for a token that is not personal data. A token is labelled when any of its characters
fall inside a (half-open, character) PII span, through the fast tokenizer's offset mapping; a
token touching two spans takes the first. The synthetic generator (the offline substitute) fills
English templates with Faker values; sample i starts with a template led by the i-th label of a
seeded shuffled cycle through all labels, so every label survives the cut to L tokens. The same
seed and Faker version give the same text.
"""

from __future__ import annotations

import logging
import re
import string
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from sodaray.data.tokenizer import DatasetError
from sodaray.io.files import parse_json

log = logging.getLogger(__name__)

PII_LABELS = tuple(
    "GIVENNAME SURNAME USERNAME IDCARDNUM CITY TELEPHONENUM SOCIALNUM ACCOUNTNUM PASSWORD EMAIL "
    "ZIPCODE TAXNUM STREET DRIVERLICENSENUM DATEOFBIRTH BUILDINGNUM CREDITCARDNUMBER".split()
)

# Each label leads at least one template, with only a word or two before its value.
TEMPLATES = (
    "{GIVENNAME} {SURNAME} lives in {CITY} and was born on {DATEOFBIRTH}.",
    "{GIVENNAME} can be reached at {TELEPHONENUM} or by email at {EMAIL}.",
    "{SURNAME}, {GIVENNAME}: social security number {SOCIALNUM}, tax number {TAXNUM}.",
    "User {USERNAME} logged in with the password {PASSWORD} from {CITY}.",
    "ID {IDCARDNUM} belongs to {GIVENNAME} {SURNAME} of {BUILDINGNUM} {STREET}.",
    "{CITY} office: {BUILDINGNUM} {STREET}, zip code {ZIPCODE}, phone {TELEPHONENUM}.",
    "Call {TELEPHONENUM} and ask for {GIVENNAME} {SURNAME}.",
    "SSN {SOCIALNUM} is on file for {GIVENNAME} {SURNAME}, born {DATEOFBIRTH}.",
    "Account {ACCOUNTNUM} was charged to card {CREDITCARDNUMBER} by {USERNAME}.",
    "Password {PASSWORD} was reset for {EMAIL} yesterday.",
    "Email {EMAIL} to update the account {ACCOUNTNUM}.",
    "Zip {ZIPCODE} covers {STREET} in {CITY}.",
    "Tax number {TAXNUM} was filed by {GIVENNAME} {SURNAME} of {CITY}.",
    "{STREET} number {BUILDINGNUM} is where {GIVENNAME} lives.",
    "License {DRIVERLICENSENUM} was issued to {GIVENNAME} {SURNAME} in {CITY}.",
    "Born {DATEOFBIRTH}, {GIVENNAME} {SURNAME} now lives at {BUILDINGNUM} {STREET}.",
    "{BUILDINGNUM} {STREET}, {CITY} {ZIPCODE} is the delivery address.",
    "Card {CREDITCARDNUMBER} is registered to {GIVENNAME} {SURNAME}, phone {TELEPHONENUM}.",
    "Username {USERNAME}, email {EMAIL}, driver's license {DRIVERLICENSENUM}.",
    "ID card {IDCARDNUM} and SSN {SOCIALNUM} were checked by {SURNAME}.",
)
_SLOT = re.compile(r"\{([A-Z]+)\}")
_DATE_FORMATS = ("%B %d, %Y", "%m/%d/%Y", "%d %B %Y", "%Y-%m-%d")
# Labels whose value is the Faker method of that name, called without arguments.
_FAKER = {
    "GIVENNAME": "first_name",
    "SURNAME": "last_name",
    "USERNAME": "user_name",
    "CITY": "city",
    "TELEPHONENUM": "phone_number",
    "SOCIALNUM": "ssn",
    "ACCOUNTNUM": "bban",
    "EMAIL": "email",
    "ZIPCODE": "zipcode",
    "STREET": "street_name",
    "BUILDINGNUM": "building_number",
    "CREDITCARDNUMBER": "credit_card_number",
}


class Span(NamedTuple):
    start: int
    end: int
    label: str


def label_tokens(
    tokenizer: Any, text: str, spans: Iterable[Span]
) -> tuple[list[int], list[str | None]]:
    """Token ids of `text` (no special tokens) and each token's PII label (None: not PII)."""
    if not getattr(tokenizer, "is_fast", False):
        raise DatasetError("PII labels need a fast tokenizer (one with an offset mapping)")
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ordered = sorted(spans)
    labels: list[str | None] = [
        next((s.label for s in ordered if end > start and start < s.end and end > s.start), None)
        for start, end in enc["offset_mapping"]
    ]
    return list(enc["input_ids"]), labels


class SyntheticPii:
    """Seeded Faker text with the span of every inserted value."""

    def __init__(self, seed: int, locale: str = "en_US") -> None:
        from faker import Faker

        self.fake = Faker(locale)
        self.fake.seed_instance(seed)
        self.random = self.fake.random  # one seeded stream for values and template choices
        self._cycle: list[str] = []
        self._leading = {
            label: [t for t in TEMPLATES if _SLOT.findall(t)[0] == label] for label in PII_LABELS
        }
        missing = [label for label, ts in self._leading.items() if not ts]
        assert not missing, f"no template starts with {missing}"
        fake = self.fake
        upper = string.ascii_uppercase
        plain = {label: getattr(fake, name) for label, name in _FAKER.items()}
        self._makers: dict[str, Callable[[], str]] = plain | {
            "IDCARDNUM": lambda: fake.bothify("??#######", letters=upper),
            "PASSWORD": lambda: fake.password(length=self.random.randint(8, 14)),
            "TAXNUM": lambda: fake.numerify("##-#######"),
            "DRIVERLICENSENUM": lambda: fake.bothify("?###-####-####", letters=upper),
            "DATEOFBIRTH": lambda: fake.date_of_birth(minimum_age=18, maximum_age=90).strftime(
                self.random.choice(_DATE_FORMATS)
            ),
        }

    def next_label(self) -> str:
        """The next label of a shuffled cycle through all labels."""
        if not self._cycle:
            self._cycle = list(PII_LABELS)
            self.random.shuffle(self._cycle)
        return self._cycle.pop()

    def sentence(self, lead: str | None = None, offset: int = 0) -> tuple[str, list[Span]]:
        """One filled template (led by `lead` when given); spans start at `offset`."""
        template = self.random.choice(self._leading[lead] if lead else TEMPLATES)
        pieces = _SLOT.split(template)  # literal, label, literal, ..., literal
        text, spans = pieces[0], []
        for label, literal in zip(pieces[1::2], pieces[2::2], strict=True):
            value = self._makers[label]()
            spans.append(Span(offset + len(text), offset + len(text) + len(value), label))
            text += value + literal
        return text, spans

    def sample(self, tokenizer: Any, length: int) -> tuple[list[int], list[str | None]]:
        """Exactly `length` tokens of synthetic PII text and their labels."""
        for _ in range(100):
            text, spans = self.sentence(self.next_label())
            ids, labels = label_tokens(tokenizer, text, spans)
            while len(ids) < length:
                more, more_spans = self.sentence(offset=len(text) + 1)
                text, spans = f"{text} {more}", spans + more_spans
                ids, labels = label_tokens(tokenizer, text, spans)
            if any(label is not None for label in labels[:length]):
                return ids[:length], labels[:length]
        raise DatasetError(f"no PII within the first {length} tokens of 100 synthetic texts")


def record_tokens(tokenizer: Any, record: dict[str, Any]) -> tuple[list[int], list[str | None]]:
    """Token ids and labels of one ai4privacy record: `source_text`, and `privacy_mask` (a list
    of {label, start, end}, or that as JSON; labels outside `PII_LABELS` are dropped)."""
    mask = record["privacy_mask"]
    if isinstance(mask, str):
        mask = parse_json(mask, "privacy_mask") if mask.strip() else []
    spans = []
    for item in mask or ():
        label = str(item.get("label", "")).upper()
        if label in PII_LABELS:
            spans.append(Span(int(item["start"]), int(item["end"]), label))
        else:
            log.debug("ignoring PII label %r", label)
    return label_tokens(tokenizer, record["source_text"], spans)
