//! Bans need evidence (issue 16 item 2), refutations cannot be forged
//! (issue 28 items 3 and 7).
//!
//! A validator's failing verdict carries, per failed rollout, what a second
//! party needs to re-check it ([`FailureEvidence`]: digest, check, position,
//! figures), and the digests of the rollouts it proved passing. Evidence
//! and passes count only on digests of the verdict's miner and window that
//! the store holds (a claim on any other digest is void). A failure bans
//! its miner only once it is *confirmed*:
//!
//! - by the coordinator itself: its door penalties, or a failure it re-ran
//!   without a model ([`Rechecker`]: the protocol's model-free checks,
//!   [`ModelFreeCheck`] — signature, structure and contract, prompt
//!   re-derived from the task, reward recomputed from the completion)
//!   on the rollout the evidence names — it then signs its own verdict, so
//!   the confirmation is stored like any verdict;
//! - by the trainer's own proof (the gradient gate posts a verdict for the
//!   failures it found);
//! - by a second member of the miner's committee posting a failing verdict
//!   on the same miner and window (a rollout digest names its miner and
//!   window).
//!
//! A single unconfirmed failure from a member of the miner's committee is
//! *pending*: the miner's standing for that window is `Suspect`, it is paid
//! nothing for the weights' span, and it is not banned. A claim from a
//! validator outside the committee is sent to the committee for
//! confirmation and holds nobody `Suspect`.
//!
//! Refutation. Only a member of the miner's committee, or the trainer, may
//! refute: when its passing proof of a rollout contradicts a validator's
//! hard evidence on it, that validator is *flagged*: its verdicts stop
//! counting (they are set aside, not deleted) until an operator clears it
//! (`coordinator clear-validator`). The trainer's proof has no sketch check
//! and no cross-miner copy check, so its passes refute neither. A failure
//! the coordinator or the trainer proved itself (the coordinator's
//! re-check, the trainer's proof; both recorded as claims) is never
//! refuted: a validator's pass of that rollout, before or after, flags the
//! validator that passed it; every refutation of a claim on that miner's
//! rollouts of that window is withdrawn (the miner is proven to cheat there),
//! and so is every refutation the contradicted validator's passes made. A
//! colluder passing its partner's rollouts ahead of time flags the honest
//! prover only until a proof catches the partner, or a third validator's
//! proof outvotes it: a claim refuted by one validator's pass alone is a
//! *dispute* ([`Tribunal::disputes`]); the coordinator asks every other
//! validator that is not flagged to prove the rollout, and two validators'
//! failure claims on a rollout outvote one validator's pass (the passer is
//! contradicted, and the refutations its passes made are withdrawn). An
//! honest majority of the validators proving a rollout decides it.
//!
//! [`Tribunal`] is the sans-IO bookkeeping [`crate::core::Core`] keeps;
//! [`Rechecker`] is the model-free re-check the server runs on stored rollouts.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::Serialize;
use tributary_protocol::env::Environment;
use tributary_protocol::identity::PublicKey;
use tributary_protocol::prf::Seed;
use tributary_protocol::rollout::Rollout;
use tributary_protocol::tokenizer::{Tokenizer, TokenizerError};
use tributary_protocol::verify::{Contract, ModelFreeCheck, Rejection, VerifyParams};
use tributary_protocol::window::WindowId;
use tributary_protocol::wire::{FailedCheck, FailureEvidence, VerdictBody, WindowInfo};

/// Who signed a verdict, as the ban rules see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Party {
    /// The coordinator's own key (door penalties, model-free re-checks).
    Coordinator,
    /// The configured trainer (its gradient gate's proof).
    Trainer,
    /// An authorised validator.
    Validator,
}

impl Party {
    /// Whether this party's passing proof of a rollout refutes hard evidence
    /// of `check` on it: the trainer runs neither the sketch check nor the
    /// cross-miner copy check.
    pub fn refutes(self, check: FailedCheck) -> bool {
        match self {
            Party::Validator => true,
            Party::Trainer => !matches!(check, FailedCheck::Sketch | FailedCheck::Copy),
            Party::Coordinator => false,
        }
    }

    /// Whether its failures are proofs the ban rules take without a second
    /// party (the coordinator's re-check, the trainer's proof).
    pub fn proves_failures(self) -> bool {
        matches!(self, Party::Coordinator | Party::Trainer)
    }
}

/// A validator's evidence or pass that another party's proof contradicts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Refutation {
    /// The window.
    pub window: WindowId,
    /// The miner.
    pub miner: PublicKey,
    /// The rollout (hex digest).
    pub digest: String,
    /// The check the validator said failed, or (`passed`) the check the
    /// rollout it passed was proven to fail.
    pub check: &'static str,
    /// Who proved the opposite.
    pub by: PublicKey,
    /// Its role.
    pub by_party: Party,
    /// Whether the validator *passed* a rollout the coordinator or the
    /// trainer proved failing (otherwise its failure claim was refuted).
    pub passed: bool,
}

/// What `/api/validators` shows of one validator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ValidatorStatus {
    /// Its key (hex).
    pub key: String,
    /// Whether its verdicts are set aside until an operator clears it.
    pub flagged: bool,
    /// Refutations of its evidence so far.
    pub refuted: usize,
    /// Refutations an operator cleared.
    pub cleared: usize,
    /// Verdicts it posted that count (not set aside).
    pub verdicts: usize,
    /// Its latest refutations (at most [`SHOWN_REFUTATIONS`]).
    pub refutations: Vec<Refutation>,
    /// Windows (still kept) whose challenge it committed to and did not
    /// reveal in time (`Core::withheld`, `protocol::beacon`).
    pub beacon_withheld: Vec<WindowId>,
    /// Whether it withheld its last `WITHHOLD_LIMIT` reveals in a row
    /// (`Core::withholding`): then it is also `flagged`.
    pub withholding: bool,
}

/// Refutations listed per validator in [`ValidatorStatus`].
pub const SHOWN_REFUTATIONS: usize = 8;

/// Hard evidence a party posted on one rollout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Claim {
    check: FailedCheck,
    miner: PublicKey,
    party: Party,
}

/// What the core knows, when a verdict is noted, that the ban rules ask.
#[derive(Debug, Clone, Default)]
pub struct Facts {
    /// The miner's committee in the verdict's window.
    pub committee: Vec<PublicKey>,
    /// Which of the verdict's digests (passed and cited) the store holds
    /// for its miner and window: nothing else counts.
    pub held: BTreeSet<[u8; 32]>,
    /// For each digest the verdict cites: who proved it passing in the
    /// verdicts that count (validators not set aside, and the trainer).
    pub provers: BTreeMap<[u8; 32], Vec<(PublicKey, Party)>>,
}

impl Facts {
    /// Whether `by`'s pass may refute a validator's claim: a member of the
    /// miner's committee, or the trainer.
    fn may_refute(&self, by: &PublicKey, party: Party) -> bool {
        party == Party::Trainer || (party == Party::Validator && self.committee.contains(by))
    }
}

/// What noting a verdict changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Noted {
    /// Validators it flagged.
    pub flagged: Vec<PublicKey>,
    /// Validators no longer flagged (a refutation of theirs was withdrawn).
    pub unflagged: Vec<PublicKey>,
}

/// The ban rules' bookkeeping: failure claims per rollout, the trainer's
/// verdicts, refutations and operator clears.
#[derive(Debug, Default)]
pub struct Tribunal {
    /// (window, digest) → claimant → its hard evidence on the rollout.
    claims: BTreeMap<(WindowId, [u8; 32]), BTreeMap<PublicKey, Claim>>,
    /// (window, miner) → the trainer's verdict.
    trainer: BTreeMap<(WindowId, PublicKey), VerdictBody>,
    /// validator → (window, digest) → the refutation of its evidence there.
    refuted: BTreeMap<PublicKey, BTreeMap<(WindowId, [u8; 32]), Refutation>>,
    /// validator → refutations an operator cleared (it is flagged while it has more).
    cleared: BTreeMap<PublicKey, usize>,
}

impl Tribunal {
    /// Whether `validator`'s verdicts are set aside.
    pub fn is_flagged(&self, validator: &PublicKey) -> bool {
        let refuted = self.refuted.get(validator).map_or(0, BTreeMap::len);
        refuted > self.cleared.get(validator).copied().unwrap_or(0)
    }

    /// The trainer's verdict on `miner` in `window`, if it posted one.
    pub fn trainer_verdict(&self, window: WindowId, miner: &PublicKey) -> Option<&VerdictBody> {
        self.trainer.get(&(window, *miner))
    }

    /// The trainer's verdicts on `window`.
    pub fn trainer_verdicts(&self, window: WindowId) -> impl Iterator<Item = &VerdictBody> {
        self.trainer.range((window, PublicKey([0; 32]))..=(window, PublicKey([0xff; 32]))).map(|(_, v)| v)
    }

    /// The failure the coordinator or the trainer proved on the rollout, other than `except`'s.
    fn proven_failure(&self, key: &(WindowId, [u8; 32]), except: &PublicKey) -> Option<(PublicKey, Claim)> {
        self.claims.get(key)?.iter().find(|(k, c)| *k != except && c.party.proves_failures()).map(|(k, c)| (*k, *c))
    }

    /// Records `v`'s hard evidence (on held digests), signed by `party`, and
    /// applies the refutation rules to it and to its passes ([`Facts`]).
    pub fn note(&mut self, v: &VerdictBody, party: Party, facts: &Facts) -> Noted {
        let was: BTreeSet<PublicKey> = self.refuted.keys().filter(|k| self.is_flagged(k)).copied().collect();
        if party == Party::Trainer {
            self.trainer.insert((v.window, v.miner), v.clone());
        }
        if party != Party::Coordinator {
            for d in v.passed.iter().filter(|d| facts.held.contains(*d)) {
                let key = (v.window, *d);
                if let Some((by, proof)) = self.proven_failure(&key, &v.validator) {
                    // A pass against the coordinator's or the trainer's proof.
                    if party == Party::Validator {
                        self.refute(v.validator, key, proof, by, true);
                    }
                    continue;
                }
                if !facts.may_refute(&v.validator, party) || self.is_flagged(&v.validator) {
                    continue;
                }
                let claims: Vec<(PublicKey, Claim)> = self
                    .claims
                    .get(&key)
                    .map(|c| c.iter().filter(|(k, _)| **k != v.validator).map(|(k, c)| (*k, *c)).collect())
                    .unwrap_or_default();
                let validators: Vec<&(PublicKey, Claim)> =
                    claims.iter().filter(|(_, c)| c.party == Party::Validator).collect();
                if party == Party::Validator && validators.len() >= 2 {
                    // Two validators' failure claims outvote one validator's pass.
                    let (claimant, c) = *validators[0];
                    self.refute(v.validator, key, c, claimant, true);
                    continue;
                }
                for (claimant, c) in claims {
                    if c.party == Party::Validator && party.refutes(c.check) {
                        self.refute(claimant, key, Claim { party, ..c }, v.validator, false);
                    }
                }
            }
        }
        for e in v.evidence.iter().filter(|e| e.hard && facts.held.contains(&e.digest)) {
            let key = (v.window, e.digest);
            let claim = Claim { check: e.check, miner: v.miner, party };
            self.claims.entry(key).or_default().insert(v.validator, claim);
            let provers = facts.provers.get(&e.digest).map(Vec::as_slice).unwrap_or_default();
            if party.proves_failures() {
                // Every validator that passed it is contradicted.
                for (by, by_party) in provers {
                    if *by_party == Party::Validator && *by != v.validator {
                        self.refute(*by, key, claim, v.validator, true);
                    }
                }
                // The miner is proven to cheat in this window: no claim on
                // its rollouts there stays refuted (a colluder's pass of the
                // rollout a prover cited refuted it on the colluder's word).
                for r in self.refuted.values_mut() {
                    r.retain(|_, x| x.passed || x.window != v.window || x.miner != v.miner);
                }
            } else if self.proven_failure(&key, &v.validator).is_none() {
                for (by, by_party) in provers {
                    if *by == v.validator || !facts.may_refute(by, *by_party) || !by_party.refutes(e.check) {
                        continue;
                    }
                    // Another validator claimed this failure too (the claimant
                    // `by`'s pass refuted, or a tie-breaker the coordinator
                    // asked, [`Tribunal::disputes`]): two validators' claims
                    // outvote one validator's pass, which is contradicted.
                    let seconded = self.claims.get(&key).is_some_and(|c| {
                        c.iter().any(|(k, c)| k != &v.validator && k != by && c.party == Party::Validator)
                    });
                    if *by_party == Party::Validator && seconded && !self.is_flagged(&v.validator) {
                        self.refute(*by, key, claim, v.validator, true);
                    } else if !self.is_flagged(by) {
                        self.refute(v.validator, key, Claim { party: *by_party, ..claim }, *by, false);
                    }
                }
            }
        }
        // A validator whose pass a proof contradicts refutes nobody: the
        // refutations its passes made are withdrawn.
        let liars: BTreeSet<PublicKey> =
            self.refuted.iter().filter(|(_, r)| r.values().any(|x| x.passed)).map(|(k, _)| *k).collect();
        if !liars.is_empty() {
            for r in self.refuted.values_mut() {
                r.retain(|_, x| x.passed || !liars.contains(&x.by));
            }
        }
        let now: BTreeSet<PublicKey> = self.refuted.keys().filter(|k| self.is_flagged(k)).copied().collect();
        Noted { flagged: now.difference(&was).copied().collect(), unflagged: was.difference(&now).copied().collect() }
    }

    /// The rollouts of `miner` in `window` on which a validator's failure
    /// claim stands refuted by another validator's pass alone: (digest,
    /// claimant, passer). Neither word is a proof; the coordinator asks a
    /// third validator to prove the rollout ([`crate::core::Core::confirmations`]),
    /// and a second claim outvotes the pass ([`Tribunal::note`]).
    pub fn disputes(&self, window: WindowId, miner: &PublicKey) -> Vec<([u8; 32], PublicKey, PublicKey)> {
        let mut out = Vec::new();
        for (claimant, refuted) in &self.refuted {
            let lo = (window, [0u8; 32]);
            let hi = (window, [0xffu8; 32]);
            for ((_, d), r) in refuted.range(lo..=hi) {
                if r.miner == *miner && !r.passed && r.by_party == Party::Validator {
                    out.push((*d, *claimant, r.by));
                }
            }
        }
        out
    }

    /// Records that `by` (of `c.party`) contradicts `validator` on `key`:
    /// its claim `c` there (`passed`: its pass, against the proof `c`).
    fn refute(&mut self, validator: PublicKey, key: (WindowId, [u8; 32]), c: Claim, by: PublicKey, passed: bool) {
        self.refuted.entry(validator).or_default().entry(key).or_insert_with(|| Refutation {
            window: key.0,
            miner: c.miner,
            digest: hex::encode(key.1),
            check: c.check.as_str(),
            by,
            by_party: c.party,
            passed,
        });
    }

    /// An operator clears `validator`: its refutations so far no longer
    /// flag it (a later one does). Returns the count to persist.
    pub fn clear(&mut self, validator: &PublicKey) -> usize {
        let n = self.refuted.get(validator).map_or(0, BTreeMap::len);
        self.cleared.insert(*validator, n);
        n
    }

    /// Restores a clear recorded by an operator (at start).
    pub fn set_cleared(&mut self, validator: PublicKey, refutations: usize) {
        self.cleared.insert(validator, refutations);
    }

    /// The status of each of `validators` (and of any other flagged key).
    pub fn statuses(
        &self,
        validators: impl IntoIterator<Item = PublicKey>,
        counted: impl Fn(&PublicKey) -> usize,
    ) -> Vec<ValidatorStatus> {
        let mut keys: BTreeSet<PublicKey> = validators.into_iter().collect();
        keys.extend(self.refuted.keys().copied());
        keys.into_iter()
            .map(|k| {
                let refs = self.refuted.get(&k);
                let mut refutations: Vec<Refutation> = refs.map(|r| r.values().cloned().collect()).unwrap_or_default();
                refutations.sort_by_key(|r| std::cmp::Reverse(r.window));
                refutations.truncate(SHOWN_REFUTATIONS);
                ValidatorStatus {
                    key: k.to_string(),
                    flagged: self.is_flagged(&k),
                    refuted: refs.map_or(0, BTreeMap::len),
                    cleared: self.cleared.get(&k).copied().unwrap_or(0),
                    verdicts: counted(&k),
                    refutations,
                    beacon_withheld: Vec::new(),
                    withholding: false,
                }
            })
            .collect()
    }

    /// Entries held: claims, trainer verdicts and refutations ([`crate::core::Core::footprint`]).
    pub fn len(&self) -> usize {
        self.claims.len() + self.trainer.len() + self.refuted.values().map(BTreeMap::len).sum::<usize>()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets proofs and claims of windows before `from` (refutations stay).
    pub fn prune(&mut self, from: WindowId) {
        let keep = |k: &(WindowId, [u8; 32])| k.0 >= from;
        self.claims.retain(|k, _| keep(k));
        self.trainer.retain(|(w, _), _| *w >= from);
    }
}

/// Why the coordinator cannot re-check rollouts.
#[derive(Debug, thiserror::Error)]
pub enum RecheckError {
    /// The genesis model's tokenizer could not be built.
    #[error("tokenizer: {0}")]
    Tokenizer(#[from] TokenizerError),
    /// The genesis model could not be read.
    #[error("genesis model: {0}")]
    Checkpoint(#[from] tributary_protocol::checkpoint::CheckpointError),
}

/// The coordinator's model-free re-check of a stored rollout: what the
/// validator's and the trainer's cheap stage run, from the genesis model's
/// tokenizer (every checkpoint of a network shares it) and the window's
/// contract.
pub struct Rechecker {
    tokenizer: Tokenizer,
    eos: Vec<u32>,
    vocab: u32,
    gsm8k: Option<std::path::PathBuf>,
}

impl std::fmt::Debug for Rechecker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rechecker").field("vocab", &self.vocab).finish_non_exhaustive()
    }
}

impl Rechecker {
    /// A re-checker with the tokenizer of the GGUF file `genesis`; `gsm8k`
    /// is the dataset file of a gsm8k network (without it gsm8k prompts and
    /// rewards cannot be re-derived, and such failures wait for a second party).
    pub fn open(genesis: &Path, gsm8k: Option<&Path>) -> Result<Self, RecheckError> {
        let tokenizer = Tokenizer::from_gguf_file(genesis)?;
        let eos = tokenizer.eog_ids().collect();
        // The model's vocabulary, as the validator's structure check uses it
        // (the tokenizer's may be smaller).
        let vocab = tributary_protocol::checkpoint::Checkpoint::open(genesis)?.config().vocab_size;
        let vocab = u32::try_from(vocab).unwrap_or(u32::MAX);
        Ok(Self { tokenizer, eos, vocab, gsm8k: gsm8k.map(Path::to_path_buf) })
    }

    /// The first model-free hard check `r` fails under `info`'s contract, as
    /// evidence; `None` if it passes them all, or if the window's
    /// environment cannot be built here (nothing is confirmed then but the
    /// signature).
    pub fn check(&self, r: &Rollout, info: &WindowInfo) -> Option<FailureEvidence> {
        let env = match Environment::build(&info.env_spec(), self.gsm8k.as_deref()) {
            Ok(e) => e,
            Err(e) => {
                tracing::debug!(error = %e, "environment unavailable: only the signature is re-checked");
                let bad = r.verify_signature().is_err();
                return bad.then(|| FailureEvidence::of_rejection(r, &Rejection::Signature));
            }
        };
        // The sketch check is not run: no challenge is needed.
        let contract = Contract::of_window(info, &env, Seed([0; 32]));
        let check = ModelFreeCheck {
            tokenizer: &self.tokenizer,
            eos_tokens: &self.eos,
            vocab_size: self.vocab,
            context: None,
            signatures: true,
            params: &VerifyParams::DEFAULT,
        };
        match check.run(r, &contract) {
            Ok(p) => FailureEvidence::of_verdict(r, &p.verdict),
            Err(Rejection::Environment(e)) => {
                tracing::debug!(error = %e, "the task's prompt does not tokenize: no model-free re-check");
                None
            }
            Err(e) => Some(FailureEvidence::of_rejection(r, &e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tributary_protocol::identity::Keypair;
    use tributary_protocol::wire::Figures;

    fn key(n: u8) -> PublicKey {
        Keypair::from_seed([n; 32]).public()
    }

    fn body(
        validator: PublicKey,
        miner: PublicKey,
        passed: Vec<[u8; 32]>,
        failed: &[([u8; 32], FailedCheck)],
    ) -> VerdictBody {
        VerdictBody {
            window: 3,
            miner,
            validator,
            checked: (passed.len() + failed.len()) as u32,
            valid: passed.len() as u32,
            estimated_valid: passed.len() as u32,
            hard_failure: !failed.is_empty(),
            soft_failures: 0,
            reasons: vec![],
            passed,
            evidence: failed
                .iter()
                .map(|(d, c)| FailureEvidence {
                    digest: *d,
                    group: 0,
                    rollout: 0,
                    check: *c,
                    hard: true,
                    position: Some(7),
                    figures: Figures::None,
                })
                .collect(),
        }
    }

    /// The verdicts noted so far, standing in for the core's (who proved
    /// what passing); every key is in the committee and every digest held.
    #[derive(Default)]
    struct Book(Vec<(VerdictBody, Party)>);

    impl Book {
        fn note(&mut self, t: &mut Tribunal, v: &VerdictBody, party: Party) -> Vec<PublicKey> {
            let provers = |d: &[u8; 32]| {
                self.0
                    .iter()
                    .filter(|(b, p)| *p != Party::Coordinator && b.passed.contains(d) && !t.is_flagged(&b.validator))
                    .map(|(b, p)| (b.validator, *p))
                    .collect::<Vec<_>>()
            };
            let facts = Facts {
                committee: (0..10).map(key).collect(),
                held: v.passed.iter().copied().chain(v.evidence.iter().map(|e| e.digest)).collect(),
                provers: v.hard_failed().map(|d| (*d, provers(d))).collect(),
            };
            let noted = t.note(v, party, &facts);
            self.0.push((v.clone(), party));
            noted.flagged
        }
    }

    #[test]
    fn a_pass_refutes_evidence_in_either_order_and_clearing_lasts_until_the_next() {
        let (liar, honest, miner) = (key(1), key(2), key(9));
        let mut t = Tribunal::default();
        let mut book = Book::default();
        assert_eq!(
            book.note(&mut t, &body(liar, miner, vec![], &[([5; 32], FailedCheck::Sampling)]), Party::Validator),
            vec![]
        );
        assert!(!t.is_flagged(&liar));
        assert_eq!(book.note(&mut t, &body(honest, miner, vec![[5; 32], [6; 32]], &[]), Party::Validator), vec![liar]);
        assert!(t.is_flagged(&liar) && !t.is_flagged(&honest));
        assert_eq!(t.clear(&liar), 1);
        assert!(!t.is_flagged(&liar));
        // Claim after the pass: refuted at once.
        assert_eq!(
            book.note(&mut t, &body(liar, miner, vec![], &[([6; 32], FailedCheck::Logprob)]), Party::Validator),
            vec![liar]
        );
        let s = t.statuses([liar, honest], |_| 0);
        assert!(s.iter().any(|v| v.key == liar.to_string() && v.flagged && v.refuted == 2 && v.cleared == 1));
        assert!(s.iter().any(|v| v.key == honest.to_string() && !v.flagged));
    }

    #[test]
    fn the_trainer_refutes_only_what_it_checks() {
        let (v, trainer, miner) = (key(1), key(3), key(9));
        let mut t = Tribunal::default();
        let mut book = Book::default();
        book.note(
            &mut t,
            &body(v, miner, vec![], &[([5; 32], FailedCheck::Sketch), ([6; 32], FailedCheck::Copy)]),
            Party::Validator,
        );
        assert_eq!(book.note(&mut t, &body(trainer, miner, vec![[5; 32], [6; 32]], &[]), Party::Trainer), vec![]);
        book.note(&mut t, &body(v, miner, vec![], &[([7; 32], FailedCheck::Reward)]), Party::Validator);
        assert_eq!(book.note(&mut t, &body(trainer, miner, vec![[7; 32]], &[]), Party::Trainer), vec![v]);
        // A validator's own pass of its own claim refutes nothing; the coordinator's passes are not proofs.
        let mut t = Tribunal::default();
        let mut book = Book::default();
        book.note(&mut t, &body(v, miner, vec![], &[([5; 32], FailedCheck::Sampling)]), Party::Validator);
        assert_eq!(book.note(&mut t, &body(v, miner, vec![[5; 32]], &[]), Party::Validator), vec![]);
        assert_eq!(book.note(&mut t, &body(key(4), miner, vec![[5; 32]], &[]), Party::Coordinator), vec![]);
    }

    /// Issue 28 item 3: a failure the coordinator proved is never refuted: a
    /// committee member's pass that refuted the claimant first is turned
    /// around once the coordinator's re-check lands (the claimant is no longer
    /// flagged, the passer is), and a later pass flags its validator too.
    #[test]
    fn a_pass_against_a_proven_failure_flags_the_passer() {
        let (prover, colluder, late, coordinator, miner) = (key(1), key(2), key(3), key(4), key(9));
        let mut t = Tribunal::default();
        let mut book = Book::default();
        book.note(&mut t, &body(prover, miner, vec![], &[([5; 32], FailedCheck::Reward)]), Party::Validator);
        assert_eq!(book.note(&mut t, &body(colluder, miner, vec![[5; 32]], &[]), Party::Validator), vec![prover]);
        let own = body(coordinator, miner, vec![], &[([5; 32], FailedCheck::Reward)]);
        let provers = vec![(colluder, Party::Validator)];
        let facts = Facts {
            committee: vec![prover, colluder],
            held: [[5; 32]].into_iter().collect(),
            provers: [([5; 32], provers)].into_iter().collect(),
        };
        let noted = t.note(&own, Party::Coordinator, &facts);
        assert_eq!(noted, Noted { flagged: vec![colluder], unflagged: vec![prover] });
        assert_eq!(book.note(&mut t, &body(late, miner, vec![[5; 32]], &[]), Party::Validator), vec![late]);
        let s = t.statuses([prover, colluder, late], |_| 0);
        assert!(
            s.iter().any(|v| v.key == colluder.to_string()
                && v.refutations[0].passed
                && v.refutations[0].by == coordinator)
        );
        assert!(!t.is_flagged(&prover));
    }
}
