"""Punctuations, the trAcker paper's baseline mechanism: in-band REGISTER/SEAL/
UNREGISTER records in every data partition (:mod:`.hook`), their alignment
(:mod:`.aligner`), a consumer task (:mod:`.reader`) and the progress writer to the control
topic (:mod:`.service`)."""

from substreams.punctuation.aligner import (
    Aligner,
    Event,
    Late,
    Punctuation,
    Released,
    Terminated,
)

__all__ = ["Aligner", "Event", "Late", "Punctuation", "Released", "Terminated"]
