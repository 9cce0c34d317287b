//! What each attempt sends: a pure, deterministic function of the attempt's index, so
//! open- and closed-loop drivers, any number of tasks, and a rerun with the same seed all
//! produce the same requests without sharing state.

/// How far back (in attempts) a client retry looks for the request it repeats: short, so
/// the original is usually still in flight — the duplicates are concurrent, which is the
/// case that tests idempotency hardest.
pub const RETRY_WINDOW: u64 = 64;

/// Most steps taken to follow a retry of a retry back to the original intent. Chains are
/// geometric in `retry_share` (a share of 0.1 gives length 1 almost always); past this
/// bound the attempt is simply treated as a new intent.
const RETRY_CHAIN_MAX: u32 = 64;

/// What happens to an order after its 201 in the mixed scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FollowUp {
    Pay,
    Cancel,
    /// Left unpaid until the payment timeout cancels it.
    Expire,
}

/// The workload's parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    /// Distinguishes this run's request_ids from any other run's.
    pub tag: String,
    pub seed: u64,
    pub users: u64,
    /// Share of attempts that re-send an earlier attempt's request_id (0..=0.9).
    pub retry_share: f64,
    /// Shares of new orders that are paid / cancelled; the rest expire. Both 0 outside
    /// the mixed scenario.
    pub pay_share: f64,
    pub cancel_share: f64,
}

/// One purchase attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    /// The attempt whose intent this is (itself unless it is a retry).
    pub intent: u64,
    pub user_id: i64,
    /// Whether this attempt re-sends an earlier attempt's request_id.
    pub is_retry: bool,
}

/// SplitMix64: a fast, well-mixed hash of a 64-bit value.
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A uniform number in [0, 1) from a hash.
fn unit(h: u64) -> f64 {
    (h >> 11) as f64 / (1u64 << 53) as f64
}

impl Workload {
    fn hash(&self, k: u64, salt: u64) -> u64 {
        mix(mix(self.seed ^ salt).wrapping_add(k))
    }

    fn retries(&self, k: u64) -> bool {
        k > 0 && unit(self.hash(k, 1)) < self.retry_share
    }

    /// The earlier attempt that attempt `k` (a retry) repeats, within the window.
    fn target(&self, k: u64) -> u64 {
        let back = 1 + self.hash(k, 2) % k.min(RETRY_WINDOW);
        k - back
    }

    /// What attempt `k` sends.
    pub fn attempt(&self, k: u64) -> Attempt {
        let mut intent = k;
        let mut steps = 0;
        while self.retries(intent) && steps < RETRY_CHAIN_MAX {
            intent = self.target(intent);
            steps += 1;
        }
        if self.retries(intent) {
            // Chain too long (only with absurd shares): a fresh intent of its own.
            intent = k;
        }
        Attempt {
            intent,
            user_id: self.user_of(intent),
            is_retry: intent != k,
        }
    }

    /// The user of an intent: intents go round the users in a scrambled order, so every
    /// user appears once the intents outnumber the users.
    pub fn user_of(&self, intent: u64) -> i64 {
        let users = self.users.max(1);
        // An odd multiplier is a bijection modulo any power of two; modulo other user
        // counts it is one as long as it shares no factor with the count, which the
        // search below ensures.
        let mut step = (0x9E37_79B9u64 % users) | 1;
        while gcd(step, users) != 1 {
            step += 2;
        }
        // Both factors are below `users` (at most 2^32, see the command line), so the
        // product does not overflow.
        let scrambled = (intent % users) * (step % users) % users;
        1 + scrambled as i64
    }

    /// The request_id of an intent: 1–64 characters of `[A-Za-z0-9_.:-]`.
    pub fn request_id(&self, intent: u64) -> String {
        format!("{}-{intent}", self.tag)
    }

    /// Appends `request_id(intent)` to `out`, with no string of its own: the load's POSTs
    /// write it straight into their body.
    pub fn push_request_id(&self, intent: u64, out: &mut Vec<u8>) {
        out.extend_from_slice(self.tag.as_bytes());
        out.push(b'-');
        out.extend_from_slice(itoa::Buffer::new().format(intent).as_bytes());
    }

    /// What to do with the order created by `intent`.
    pub fn follow_up(&self, intent: u64) -> FollowUp {
        let u = unit(self.hash(intent, 3));
        if u < self.pay_share {
            FollowUp::Pay
        } else if u < self.pay_share + self.cancel_share {
            FollowUp::Cancel
        } else {
            FollowUp::Expire
        }
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{HashMap, HashSet};

    fn workload(retry_share: f64, users: u64) -> Workload {
        Workload {
            tag: "t1234567".into(),
            seed: 42,
            users,
            retry_share,
            pay_share: 0.5,
            cancel_share: 0.2,
        }
    }

    // Checks the retry share and the retry window: over 100,000 attempts about 10% are
    // retries, each repeats an earlier non-retry intent within RETRY_WINDOW, with that
    // intent's user (so the replay has the same payload, not a request_id_conflict).
    #[test]
    fn retries_repeat_recent_intents_with_the_same_payload() {
        let w = workload(0.1, 50_000);
        let n = 100_000;
        let mut retries = 0;
        for k in 0..n {
            let a = w.attempt(k);
            if a.is_retry {
                retries += 1;
                assert!(a.intent < k, "{k} {a:?}");
                assert!(
                    k - w.target(k) <= RETRY_WINDOW,
                    "first hop within the window"
                );
                assert!(!w.attempt(a.intent).is_retry, "intent {a:?} is itself new");
                assert_eq!(a.user_id, w.attempt(a.intent).user_id);
            } else {
                assert_eq!(a.intent, k);
            }
        }
        let share = retries as f64 / n as f64;
        assert!((0.09..0.11).contains(&share), "retry share {share}");
        assert_eq!(w.attempt(7), w.attempt(7), "deterministic");
    }

    // Checks users are covered: 200,000 new intents over 50,000 users (the rush's sizes)
    // touch every user, each about 4 times; also for a user count that is not a power of
    // two and shares factors with the multiplier search.
    #[test]
    fn every_user_appears() {
        for users in [50_000u64, 1000, 7, 1] {
            let w = workload(0.0, users);
            let mut seen: HashMap<i64, u32> = HashMap::new();
            for k in 0..users * 4 {
                *seen.entry(w.attempt(k).user_id).or_default() += 1;
            }
            assert_eq!(seen.len() as u64, users, "users {users}");
            assert!(seen.keys().all(|&u| u >= 1 && u as u64 <= users));
            assert!(seen.values().all(|&c| c == 4));
        }
    }

    // Checks request_ids are unique per intent and valid for the API (1-64 characters of
    // [A-Za-z0-9_.:-]) even at the largest index.
    #[test]
    fn request_ids_are_unique_and_valid() {
        let w = workload(0.0, 10);
        let ids: HashSet<String> = (0..10_000).map(|k| w.request_id(k)).collect();
        assert_eq!(ids.len(), 10_000);
        let longest = w.request_id(u64::MAX);
        assert!(longest.len() <= 64);
        assert!(longest
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_.:-".contains(c)));
    }

    // Checks the request_id written into a body is the one `request_id` gives, at the
    // smallest, a middling and the largest intent, after bytes already in the buffer.
    #[test]
    fn a_pushed_request_id_is_the_request_id() {
        let w = workload(0.0, 10);
        for k in [0, 12_345, u64::MAX] {
            let mut out = b"x".to_vec();
            w.push_request_id(k, &mut out);
            assert_eq!(out, format!("x{}", w.request_id(k)).into_bytes());
        }
    }

    // Checks follow-ups split new orders by the configured shares (50% pay, 20% cancel,
    // 30% expire, within a percent over 100,000 intents) and are deterministic.
    #[test]
    fn follow_ups_follow_the_shares() {
        let w = workload(0.0, 10);
        let mut counts: HashMap<FollowUp, u32> = HashMap::new();
        for k in 0..100_000 {
            *counts.entry(w.follow_up(k)).or_default() += 1;
        }
        let share = |f| counts[&f] as f64 / 100_000.0;
        assert!((share(FollowUp::Pay) - 0.5).abs() < 0.01);
        assert!((share(FollowUp::Cancel) - 0.2).abs() < 0.01);
        assert!((share(FollowUp::Expire) - 0.3).abs() < 0.01);
        assert_eq!(w.follow_up(99), w.follow_up(99));
    }
}
