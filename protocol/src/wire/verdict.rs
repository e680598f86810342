//! Verdicts, standings and the weights document.

use serde::{Deserialize, Serialize};

use super::{Blob, Signed, SignedBody, Tag, WireError, canonical};
use crate::identity::{self, PublicKey};
use crate::rollout::Rollout;
use crate::verify::{self, CheckKind, Failure, Rejection, Severity};
use crate::window::WindowId;

/// A validator's findings about one miner in one window (the signed part of a [`Verdict`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VerdictBody {
    /// The window checked.
    pub window: WindowId,
    /// The miner checked.
    pub miner: PublicKey,
    /// The validator.
    pub validator: PublicKey,
    /// Rollouts checked.
    pub checked: u32,
    /// Of those, rollouts that passed every check.
    pub valid: u32,
    /// Estimated valid rollouts of the miner in the window (extrapolated from the sample).
    pub estimated_valid: u32,
    /// A hard check failed (proof, logprobs, prompt, signature...): ban.
    pub hard_failure: bool,
    /// Soft checks that failed (distribution...).
    pub soft_failures: u32,
    /// The failed checks with their figures, one line each (at most
    /// [`MAX_VERDICT_REASONS`] lines of at most [`MAX_REASON_LEN`] bytes).
    pub reasons: Vec<String>,
    /// Digests of rollouts this signer proved to pass every hard check (at
    /// most [`MAX_VERDICT_PASSED`]): what refutes another party's failing
    /// evidence on the same rollout.
    #[serde(deserialize_with = "bounded::<_, _, MAX_VERDICT_PASSED>")]
    pub passed: Vec<[u8; 32]>,
    /// What a second party needs to re-check each failure cheaply (at most
    /// [`MAX_VERDICT_EVIDENCE`], hard failures first).
    #[serde(deserialize_with = "bounded::<_, _, MAX_VERDICT_EVIDENCE>")]
    pub evidence: Vec<FailureEvidence>,
}

/// Most [`FailureEvidence`] records in a [`VerdictBody`].
pub const MAX_VERDICT_EVIDENCE: usize = 8;

/// Most passing digests in a [`VerdictBody`].
pub const MAX_VERDICT_PASSED: usize = 256;

/// The largest [`VerdictBody`] frame: the passing digests, the reasons and the evidence.
pub const MAX_VERDICT_LEN: u32 = 16 << 10;

/// The check a [`FailureEvidence`] names: a protocol check ([`CheckKind`],
/// [`FailedCheck::of`]) or a rejection that is none. Its own enum because its
/// variant numbers are the wire encoding: never reorder, only append.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum FailedCheck {
    /// The rollout's signature does not verify.
    Signature,
    /// The task's prompt could not be derived.
    Environment,
    /// Structure, contract, lengths, ranges ([`CheckKind::Structure`]).
    Structure,
    /// More tokens than the model's context.
    Context,
    /// Prompt tokens differ from the assigned task's.
    Prompt,
    /// The reward differs from the one recomputed from the completion.
    Reward,
    /// Sketches at challenged positions.
    Sketch,
    /// Log-probs against the reference model.
    Logprob,
    /// The exact seeded-sampling check.
    Sampling,
    /// Share of positions the sampling check could decide (soft).
    SamplingCoverage,
    /// Token-distribution statistics (soft).
    Distribution,
    /// Length limit / end-of-generation rules.
    Termination,
    /// A copy of another miner's rollout that fails its own checks.
    Copy,
}

impl FailedCheck {
    /// The evidence name of a protocol check.
    pub fn of(kind: CheckKind) -> Self {
        match kind {
            CheckKind::Structure => FailedCheck::Structure,
            CheckKind::Prompt => FailedCheck::Prompt,
            CheckKind::Reward => FailedCheck::Reward,
            CheckKind::Sketch => FailedCheck::Sketch,
            CheckKind::Logprob => FailedCheck::Logprob,
            CheckKind::Sampling => FailedCheck::Sampling,
            CheckKind::SamplingCoverage => FailedCheck::SamplingCoverage,
            CheckKind::Distribution => FailedCheck::Distribution,
            CheckKind::Termination => FailedCheck::Termination,
        }
    }

    /// The protocol check this names, if it names one (the inverse of [`FailedCheck::of`]).
    pub fn kind(self) -> Option<CheckKind> {
        CheckKind::ALL.into_iter().find(|&k| Self::of(k) == self)
    }

    /// The check's name (as in verdict reasons and metrics): a protocol
    /// check's is its [`CheckKind::as_str`].
    pub fn as_str(self) -> &'static str {
        match self {
            FailedCheck::Signature => "signature",
            FailedCheck::Environment => "environment",
            FailedCheck::Context => "context",
            FailedCheck::Copy => "copy",
            other => other.kind().map_or("unknown", CheckKind::as_str),
        }
    }

    /// Whether whoever holds the rollout and its window's contract can
    /// re-run the check without a model: the signature, the structure and
    /// contract, the prompt re-derived from the task, the reward recomputed
    /// from the completion.
    pub fn model_free(self) -> bool {
        matches!(self, FailedCheck::Signature | FailedCheck::Structure | FailedCheck::Prompt | FailedCheck::Reward)
    }
}

/// The reference figures of a failure: what the checker computed against
/// what the rollout claims, enough to re-check it at the named position.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Figures {
    /// Nothing beyond the check and position.
    None,
    /// A draw outside the claimed token's CDF interval.
    Sampling {
        /// The seeded draw.
        u: f64,
        /// The claimed token's interval start (the checker's).
        lo: f64,
        /// Its end.
        hi: f64,
        /// Positions outside in the rollout.
        outside: u32,
    },
    /// A log-prob off the reference.
    Logprob {
        /// The rollout's log-prob.
        claimed: f32,
        /// The checker's, when it had it.
        reference: Option<f32>,
        /// |claimed − reference| in nats (or the value, if not finite).
        delta: f64,
    },
    /// Sketches too far from the checker's.
    Sketch {
        /// Distance at the worst position.
        distance: u32,
        /// Its tolerance.
        tolerance: u32,
        /// Challenged positions that failed.
        failed: u32,
        /// Challenged positions checked.
        checked: u32,
    },
    /// The reported reward against the recomputed one.
    Reward {
        /// The rollout's.
        claimed: f32,
        /// Recomputed from the completion.
        recomputed: f32,
    },
    /// Prompt lengths (the position is the first differing token).
    Prompt {
        /// The assigned task's prompt length.
        expected_len: u32,
        /// The rollout's.
        got_len: u32,
    },
    /// The miner whose identical rollout passes.
    Copy {
        /// Its key.
        owner: PublicKey,
    },
}

/// One failed check of one rollout, as a second party needs it to re-check
/// the failure cheaply: which rollout (its digest), which check, where, and
/// the figures on both sides.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailureEvidence {
    /// The rollout's digest ([`Rollout::digest`]).
    pub digest: [u8; 32],
    /// Its group index.
    pub group: u32,
    /// Its index in the group.
    pub rollout: u32,
    /// The check.
    pub check: FailedCheck,
    /// Whether the check is hard (rejects the rollout).
    pub hard: bool,
    /// The absolute token position, when the failure names one.
    pub position: Option<u32>,
    /// The figures.
    pub figures: Figures,
}

impl FailureEvidence {
    /// The evidence of a failed protocol check on `r`.
    pub fn of_check(r: &Rollout, kind: CheckKind, severity: Severity, f: &Failure) -> Self {
        let position = f.position(r.prompt_len as usize).and_then(|p| u32::try_from(p).ok());
        let figures = match *f {
            Failure::SampleOutside { outside, u, lo, hi, .. } => {
                Figures::Sampling { u, lo, hi, outside: u32::try_from(outside).unwrap_or(u32::MAX) }
            }
            Failure::LogprobDeviation { worst_index, worst_delta, .. } => Figures::Logprob {
                claimed: r.logprobs.get(worst_index).copied().unwrap_or(f32::NAN),
                reference: None,
                delta: worst_delta,
            },
            Failure::BadLogprob { value, .. } => {
                Figures::Logprob { claimed: value, reference: None, delta: f64::from(value) }
            }
            Failure::SketchMismatch { failed, checked, distance, tolerance, .. } => Figures::Sketch {
                distance,
                tolerance,
                failed: u32::try_from(failed).unwrap_or(u32::MAX),
                checked: u32::try_from(checked).unwrap_or(u32::MAX),
            },
            Failure::RewardMismatch { reported, recomputed } => Figures::Reward { claimed: reported, recomputed },
            Failure::PromptMismatch { expected_len, got_len, .. } => Figures::Prompt {
                expected_len: u32::try_from(expected_len).unwrap_or(u32::MAX),
                got_len: u32::try_from(got_len).unwrap_or(u32::MAX),
            },
            _ => Figures::None,
        };
        Self {
            digest: r.digest(),
            group: r.group,
            rollout: r.rollout,
            check: FailedCheck::of(kind),
            hard: severity == Severity::Hard,
            position,
            figures,
        }
    }

    /// The evidence of `v`'s first hard failure on `r`, if a hard check failed.
    pub fn of_verdict(r: &Rollout, v: &verify::Verdict) -> Option<Self> {
        let c = v.first_hard_failure()?;
        c.failure().map(|f| Self::of_check(r, c.kind, c.severity, f))
    }

    /// The evidence of a rollout the model-free checks rejected
    /// ([`crate::verify::ModelFreeCheck`]).
    pub fn of_rejection(r: &Rollout, e: &Rejection) -> Self {
        let one = |check, position| Self::of_rollout(r, check, position, Figures::None);
        match e {
            Rejection::Signature => one(FailedCheck::Signature, None),
            Rejection::Environment(_) => one(FailedCheck::Environment, None),
            Rejection::Failed(v) => Self::of_verdict(r, v).unwrap_or_else(|| one(FailedCheck::Structure, None)),
            Rejection::ExceedsContext { context, .. } => one(FailedCheck::Context, Some(*context)),
            Rejection::Undecodable(_) => one(FailedCheck::Structure, None),
        }
    }

    /// The evidence of a failure that is not a protocol check's (signature,
    /// environment, context, copy).
    pub fn of_rollout(r: &Rollout, check: FailedCheck, position: Option<usize>, figures: Figures) -> Self {
        Self {
            digest: r.digest(),
            group: r.group,
            rollout: r.rollout,
            check,
            hard: true,
            position: position.and_then(|p| u32::try_from(p).ok()),
            figures,
        }
    }
}

/// A sequence of at most `N` elements: a longer one is an error before it is allocated.
fn bounded<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>, const N: usize>(d: D) -> Result<Vec<T>, D::Error> {
    struct Bounded<T, const N: usize>(std::marker::PhantomData<T>);
    impl<'de, T: Deserialize<'de>, const N: usize> serde::de::Visitor<'de> for Bounded<T, N> {
        type Value = Vec<T>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "at most {N} elements")
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
            let hint = seq.size_hint().unwrap_or(0);
            if hint > N {
                return Err(serde::de::Error::invalid_length(hint, &self));
            }
            let mut out = Vec::with_capacity(hint);
            while let Some(x) = seq.next_element()? {
                if out.len() == N {
                    return Err(serde::de::Error::invalid_length(out.len() + 1, &self));
                }
                out.push(x);
            }
            Ok(out)
        }
    }
    d.deserialize_seq(Bounded::<T, N>(std::marker::PhantomData))
}

/// Most reason lines in a [`VerdictBody`].
pub const MAX_VERDICT_REASONS: usize = 6;

/// Longest reason line in a [`VerdictBody`], in bytes.
pub const MAX_REASON_LEN: usize = 320;

impl VerdictBody {
    /// `signer`'s verdict on `miner` in `window` before any rollout is
    /// counted: nothing checked, no failure, no evidence.
    pub fn empty(window: WindowId, miner: PublicKey, signer: PublicKey) -> Self {
        Self {
            window,
            miner,
            validator: signer,
            checked: 0,
            valid: 0,
            estimated_valid: 0,
            hard_failure: false,
            soft_failures: 0,
            reasons: vec![],
            passed: vec![],
            evidence: vec![],
        }
    }

    /// Adds a reason line, truncated to [`MAX_REASON_LEN`] bytes (on a
    /// character boundary); lines beyond [`MAX_VERDICT_REASONS`] are dropped.
    pub fn add_reason(&mut self, line: &str) {
        if self.reasons.len() >= MAX_VERDICT_REASONS || self.reasons.iter().any(|r| r == line) {
            return;
        }
        let mut end = line.len().min(MAX_REASON_LEN);
        while !line.is_char_boundary(end) {
            end -= 1;
        }
        self.reasons.push(line[..end].to_owned());
    }

    /// Adds a failure's evidence; a hard failure displaces a soft one when
    /// the list is full, otherwise records beyond [`MAX_VERDICT_EVIDENCE`] are dropped.
    pub fn add_evidence(&mut self, e: FailureEvidence) {
        if self.evidence.len() < MAX_VERDICT_EVIDENCE {
            self.evidence.push(e);
        } else if e.hard
            && let Some(soft) = self.evidence.iter().position(|x| !x.hard)
        {
            self.evidence[soft] = e;
        }
    }

    /// Adds a rollout proved passing (beyond [`MAX_VERDICT_PASSED`] it is not listed).
    pub fn add_passed(&mut self, digest: [u8; 32]) {
        if self.passed.len() < MAX_VERDICT_PASSED && !self.passed.contains(&digest) {
            self.passed.push(digest);
        }
    }

    /// Digests of the rollouts this verdict says fail a hard check.
    pub fn hard_failed(&self) -> impl Iterator<Item = &[u8; 32]> {
        self.evidence.iter().filter(|e| e.hard).map(|e| &e.digest)
    }
}

/// A signed verdict.
pub type Verdict = Signed<VerdictBody>;

impl SignedBody for VerdictBody {
    const DOMAIN: &'static str = identity::domain::VERDICT;

    fn signer(&self) -> &PublicKey {
        &self.validator
    }
}

/// Coordinator → validator: verdict stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerdictAck {
    /// The window.
    pub window: WindowId,
    /// The miner.
    pub miner: PublicKey,
}

/// Trainer/validator → coordinator: what the verdicts say about a window's
/// miners (a page of them, in key order).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GetStanding {
    /// The window.
    pub window: WindowId,
    /// Resume after this miner (the previous page's `next`).
    pub after: Option<PublicKey>,
}

/// What is known of one miner in one window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum MinerStanding {
    /// Every verdict on the window passed it.
    Passed,
    /// A verdict (or the coordinator's door) failed it.
    Failed,
    /// Not judged yet, but banned or failed in the ban span: not in good standing.
    Suspect,
}

/// The coordinator's answer to [`GetStanding`]: a page of the miners it
/// knows something about for the window, in ascending key order. Miners not
/// listed on any page are unjudged and in good standing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Standing {
    /// The window.
    pub window: WindowId,
    /// Miner → standing.
    pub miners: Vec<(PublicKey, MinerStanding)>,
    /// The last miner of this page when more follow (the next request's `after`), `None` when done.
    pub next: Option<PublicKey>,
}

/// The most bytes of entries the coordinator puts in one [`Standing`] answer.
pub const STANDING_ANSWER_BYTES: usize = 256 << 10;

/// Asks for part of a weights document's bytes ([`WeightsDoc::encode`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GetWeights {
    /// The document of this interval (the previous part's `window`), or the latest.
    pub window: Option<WindowId>,
    /// From this byte of its encoding.
    pub offset: u64,
}

/// Part of a signed weights document's bytes: a reader asks from offset 0
/// and on from `offset + data.len()` for the same `window` until it holds
/// `len` bytes, then decodes them ([`WeightsDoc::decode_verified`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WeightsPart {
    /// The last window the document accounts for.
    pub window: WindowId,
    /// The document's encoded length.
    pub len: u64,
    /// Where `data` starts in it.
    pub offset: u64,
    /// The bytes.
    pub data: Blob,
}

/// The most bytes of a weights document in one [`WeightsPart`].
pub const WEIGHTS_PART_BYTES: usize = 256 << 10;

/// The largest weights document a reader decodes (about 1.6 M miners).
pub const MAX_WEIGHTS_DOC_LEN: u32 = 64 << 20;

/// The weights the coordinator derived from verdicts (signed part).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WeightsBody {
    /// The last window these weights account for.
    pub window: WindowId,
    /// Miner → weight; weights sum to 1 (or the list is empty).
    pub weights: Vec<(PublicKey, f64)>,
    /// The coordinator.
    pub coordinator: PublicKey,
}

/// A signed weights document (the coordinator's).
pub type WeightsDoc = Signed<WeightsBody>;

impl SignedBody for WeightsBody {
    const DOMAIN: &'static str = identity::domain::WEIGHTS;

    fn signer(&self) -> &PublicKey {
        &self.coordinator
    }
}

impl Signed<WeightsBody> {
    /// Checks that the document is signed by `coordinator` (the key a peer
    /// learnt in the handshake's [`Challenge`] or its configuration), not
    /// merely by whichever key it names.
    pub fn verify_by(&self, coordinator: &PublicKey) -> Result<(), WeightsDocError> {
        if self.body.coordinator != *coordinator {
            return Err(WeightsDocError::WrongCoordinator);
        }
        // The coordinator's key names its network.
        self.verify(&super::NetworkId::of(coordinator)).map_err(|_| WeightsDocError::BadSignature)
    }

    /// The document's bytes as published (`postcard(WeightsDoc)`, served in
    /// [`WeightsPart`]s); what `GET /api/weights` gives in hex.
    pub fn encode(&self) -> Vec<u8> {
        canonical(self)
    }

    /// Decodes published document bytes (at most [`MAX_WEIGHTS_DOC_LEN`],
    /// consumed exactly) and checks they are signed by `coordinator`.
    pub fn decode_verified(bytes: &[u8], coordinator: &PublicKey) -> Result<Self, WeightsDocError> {
        let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
        if len > MAX_WEIGHTS_DOC_LEN {
            return Err(WireError::Oversized { tag: Tag::Weights, len, max: MAX_WEIGHTS_DOC_LEN }.into());
        }
        let doc: Self = super::take(Tag::Weights, bytes)?;
        doc.verify_by(coordinator)?;
        Ok(doc)
    }
}

/// Why a weights document is not accepted.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum WeightsDocError {
    /// The bytes do not decode.
    #[error("weights document: {0}")]
    Wire(#[from] WireError),
    /// The document names another coordinator.
    #[error("weights document names another coordinator")]
    WrongCoordinator,
    /// The signature does not verify.
    #[error("weights document signature does not verify")]
    BadSignature,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_checks_name_the_protocol_checks_and_keep_their_wire_numbers() {
        for k in CheckKind::ALL {
            assert_eq!(FailedCheck::of(k).kind(), Some(k));
            assert_eq!(FailedCheck::of(k).as_str(), k.as_str());
        }
        use FailedCheck::*;
        let wire = [
            Signature,
            Environment,
            Structure,
            Context,
            Prompt,
            Reward,
            Sketch,
            Logprob,
            Sampling,
            SamplingCoverage,
            Distribution,
            Termination,
            Copy,
        ];
        for (i, c) in wire.iter().enumerate() {
            assert_eq!(postcard::to_allocvec(c).unwrap(), [i as u8], "{c:?}");
        }
        let names: std::collections::BTreeSet<&str> = wire.iter().map(|c| c.as_str()).collect();
        assert_eq!(names.len(), wire.len());
        assert!(!names.contains("unknown"));
        assert_eq!([Signature, Environment, Context, Copy].map(FailedCheck::kind), [None; 4]);
    }
}
