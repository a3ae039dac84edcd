//! Two-phase approvals: what a reviewer is shown, the keyed input digest, what makes an
//! approval outlive a policy reload, and the bounded store of pending ones.
//!
//! The input digest is HMAC-SHA256 under a secret the gate draws from the OS random source
//! at start: an unkeyed hash of a tool name and its arguments would let anyone holding an
//! audit log confirm a guess of the arguments (a password, a file name) offline. Its
//! recipe, documented for gateways that keep their own key: the hex of
//! `HMAC-SHA256(key, "airlock-input-v1\n" + tool + "\n" + canonical_json(input))`, where
//! canonical JSON sorts object keys at every level and has no white space.

use std::collections::HashMap;
use std::io::Read;

use airlock_policy::compile::{CompiledProfile, CompiledTool, sha256_hex};
use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Canonical JSON: keys sorted at every level, no whitespace.
pub fn canonical_json(value: &Value) -> String {
    fn sort(value: &Value) -> Value {
        match value {
            Value::Object(map) => {
                let mut entries: Vec<(&String, &Value)> = map.iter().collect();
                entries.sort_by(|a, b| a.0.cmp(b.0));
                Value::Object(
                    entries
                        .into_iter()
                        .map(|(k, v)| (k.clone(), sort(v)))
                        .collect(),
                )
            }
            Value::Array(items) => Value::Array(items.iter().map(sort).collect()),
            other => other.clone(),
        }
    }
    sort(value).to_string()
}

/// `bytes` from the OS random source, or none: callers fail closed rather than make up
/// something guessable.
pub fn os_random<const N: usize>() -> Option<[u8; N]> {
    let mut bytes = [0u8; N];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .ok()?;
    Some(bytes)
}

/// A fresh id of 128 random bits, hex; none without a random source.
pub fn random_id() -> Option<String> {
    os_random::<16>().map(|bytes| bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The secret of a gate's input digests.
#[derive(Clone)]
pub struct DigestKey([u8; 32]);

impl std::fmt::Debug for DigestKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DigestKey(..)")
    }
}

impl DigestKey {
    /// A key from the OS random source.
    pub fn random() -> Option<Self> {
        os_random::<32>().map(Self)
    }

    /// A key the gateway keeps (so digests stay comparable across restarts).
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// The keyed digest of `tool` called with `input` (recipe in the module docs).
    pub fn input_digest(&self, tool: &str, input: &Value) -> String {
        // HMAC takes keys of any length, so this cannot fail for 32 bytes.
        let Ok(mut mac) = Hmac::<sha2::Sha256>::new_from_slice(&self.0) else {
            return String::new();
        };
        mac.update(b"airlock-input-v1\n");
        mac.update(tool.as_bytes());
        mac.update(b"\n");
        mac.update(canonical_json(input).as_bytes());
        mac.finalize()
            .into_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

/// What a tool call runs as, summed up: its definition and its profile's. An approval stays
/// valid across policy reloads exactly as long as this does not change.
pub fn tool_version(tool: &CompiledTool, profile: Option<&CompiledProfile>) -> String {
    // The Debug forms hold every field (argv template, schemas, limits, the mount plan, the
    // Landlock rules, the seccomp program), and are deterministic for the same policy.
    sha256_hex(format!("{:?}\n{:?}", tool.tool, profile).as_bytes())
}

/// A serialisable two-phase approval: exactly what will run if it is executed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Approval {
    /// 128-bit random id, hex.
    pub approval_id: String,
    /// Tool name.
    pub tool: String,
    /// The validated arguments, as the tool will get them.
    pub arguments: Value,
    /// Keyed digest of the tool and its canonical arguments (see the module docs).
    pub input_digest: String,
    /// The argv the call will run (empty for a built-in).
    pub argv_preview: Vec<String>,
    /// The built-in the call will run instead of a command.
    pub builtin: Option<String>,
    /// The profile it will run in.
    pub profile: String,
    /// The deadline it will get, milliseconds.
    pub timeout_ms: u64,
    /// The proposer's session: rate limits count the call there.
    pub session: Option<String>,
    /// Why it needs a human: the rule that decided `review`, or `approval` for a tool that
    /// always asks.
    pub rule: String,
    /// The same, in words.
    pub reason: String,
    /// The policy version it was proposed under (for information; see `tool_version`).
    pub policy_version: String,
    /// The tool and profile it was proposed for: executing it is refused once they change.
    pub tool_version: String,
    /// Expiry, Unix milliseconds.
    pub expires_at_ms: u64,
}

#[derive(Debug)]
pub(crate) struct Pending {
    pub(crate) approval: Approval,
    pub(crate) call_id: String,
    pub(crate) arguments: String,
    /// What it holds, measured once: the store sums it for every proposal.
    bytes: usize,
}

impl Pending {
    /// A pending approval of `approval`, whose arguments' canonical text is `arguments`.
    pub(crate) fn new(approval: Approval, call_id: String, arguments: String) -> Self {
        // The parsed arguments, their canonical text and the argv preview dwarf the rest.
        let bytes = crate::heap::json_heap_bytes(&approval.arguments)
            + arguments.len()
            + approval.argv_preview.iter().map(String::len).sum::<usize>()
            + approval.reason.len()
            + std::mem::size_of::<Self>();
        Self {
            approval,
            call_id,
            arguments,
            bytes,
        }
    }
}

/// Bytes the pending approvals may hold together unless the gate is told otherwise.
pub const DEFAULT_MAX_APPROVAL_BYTES: usize = 16 << 20;

/// Why a proposal was not kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// As many as the policy allows are pending.
    TooMany(usize),
    /// The pending ones hold all the bytes allowed; one that ends makes room.
    Full(usize),
    /// It alone holds more than all pending approvals may.
    NeverFits(usize),
}

/// Why an approval was not handed to an executor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TakeRefused {
    /// Never proposed, already used, rejected, expired and reclaimed, or dropped in a reload.
    Unknown,
    /// Proposed in another session than the executor's.
    OtherSession,
}

/// The pending approvals, bounded by the policy's `approvals.max_pending` and by the bytes
/// they hold: each keeps its arguments for as long as the approval lives (a quarter of an
/// hour by default), and any client may propose.
#[derive(Debug)]
pub(crate) struct ApprovalStore {
    pending: HashMap<String, Pending>,
    pub(crate) max_bytes: usize,
}

impl Default for ApprovalStore {
    fn default() -> Self {
        Self {
            pending: HashMap::new(),
            max_bytes: DEFAULT_MAX_APPROVAL_BYTES,
        }
    }
}

impl ApprovalStore {
    /// Keeps `pending` if at most `max_pending` minus one are pending (expired ones
    /// forgotten first) and the bytes allow it.
    pub(crate) fn admit(
        &mut self,
        pending: Pending,
        max_pending: usize,
        now_ms: u64,
    ) -> Result<(), Refused> {
        let count = self.expire(now_ms);
        if count >= max_pending {
            return Err(Refused::TooMany(count));
        }
        let bytes = pending.bytes;
        if bytes > self.max_bytes {
            return Err(Refused::NeverFits(bytes));
        }
        let held: usize = self.pending.values().map(|p| p.bytes).sum();
        if held.saturating_add(bytes) > self.max_bytes {
            return Err(Refused::Full(held));
        }
        self.insert(pending);
        Ok(())
    }

    /// Forgets the ones expired by `now_ms`; how many remain.
    pub(crate) fn expire(&mut self, now_ms: u64) -> usize {
        self.pending
            .retain(|_, p| p.approval.expires_at_ms > now_ms);
        self.pending.len()
    }

    pub(crate) fn insert(&mut self, pending: Pending) {
        self.pending
            .insert(pending.approval.approval_id.clone(), pending);
    }

    /// Takes one out: of several concurrent takers exactly one gets it.
    pub(crate) fn take(&mut self, approval_id: &str) -> Option<Pending> {
        self.pending.remove(approval_id)
    }

    /// Takes one out for an executor in `session` (`None`: an approver outside any
    /// session, for whom the proposer's session counts). An executor from another session
    /// is refused and the approval stays pending: a refused executor must not be able to
    /// burn someone else's approval.
    pub(crate) fn take_for(
        &mut self,
        approval_id: &str,
        session: Option<&str>,
    ) -> Result<Pending, TakeRefused> {
        let pending = self.pending.get(approval_id).ok_or(TakeRefused::Unknown)?;
        if session.is_some() && session != pending.approval.session.as_deref() {
            return Err(TakeRefused::OtherSession);
        }
        self.pending.remove(approval_id).ok_or(TakeRefused::Unknown)
    }

    /// Keeps the approvals `still_valid` says are, after a policy reload.
    pub(crate) fn retain(&mut self, mut still_valid: impl FnMut(&Approval) -> bool) {
        self.pending.retain(|_, p| still_valid(&p.approval));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn digests_are_keyed_canonical_and_bound_to_the_tool() {
        let key = DigestKey::from_bytes([7; 32]);
        let a = key.input_digest("echo", &json!({"b": 1, "a": [2, {"d": 3, "c": 4}]}));
        let same = key.input_digest("echo", &json!({"a": [2, {"c": 4, "d": 3}], "b": 1}));
        assert_eq!(a, same, "key order does not matter");
        assert_eq!(a.len(), 64);
        assert_ne!(
            a,
            key.input_digest("echo2", &json!({"b": 1, "a": [2, {"d": 3, "c": 4}]}))
        );
        let other_key = DigestKey::from_bytes([8; 32]);
        assert_ne!(
            a,
            other_key.input_digest("echo", &json!({"b": 1, "a": [2, {"d": 3, "c": 4}]}))
        );
        // Not the unkeyed hash of the same text: a log reader cannot confirm a guess.
        let unkeyed = sha256_hex(
            format!(
                "airlock-input-v1\necho\n{}",
                canonical_json(&json!({"b": 1, "a": [2, {"d": 3, "c": 4}]}))
            )
            .as_bytes(),
        );
        assert_ne!(a, unkeyed);
    }

    #[test]
    fn the_digest_recipe_is_the_documented_hmac() {
        // RFC 4231 test case 2 checks the HMAC itself; here the documented framing.
        let key = DigestKey::from_bytes([0x0b; 32]);
        let mut mac = Hmac::<sha2::Sha256>::new_from_slice(&[0x0b; 32]).unwrap();
        mac.update(b"airlock-input-v1\nt\n{\"a\":1}");
        let expected: String = mac
            .finalize()
            .into_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(key.input_digest("t", &json!({"a": 1})), expected);
    }

    #[test]
    fn random_ids_are_128_bits_of_hex_and_differ() {
        let a = random_id().unwrap();
        let b = random_id().unwrap();
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
