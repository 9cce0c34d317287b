//! Rate limits of purchases, per user (the purchase use case, `service.rs`) and per
//! client address (the HTTP layer): the seeds' entry protection (对每个 IP 与每个 UID 做
//! 限流: a client that presses "buy" far more often than a person can is told to retry
//! later, before it costs the stores anything). Pure: times are passed in, on whatever
//! monotonic clock the caller reads for all its calls.
//!
//! Each key has one GCRA cell (the generic cell rate algorithm): the *theoretical
//! arrival time* of its next request, a `u64` of nanoseconds. A request at `now` passes
//! when that time is at most `burst - 1` emission intervals ahead of `now`, and moves it
//! one interval on; otherwise it is refused with how long until it would pass. A cell
//! whose time is behind `now` is indistinguishable from no cell (a full burst), so it can
//! be dropped whenever room is needed.
//!
//! Bounded: at most [`KEYS_MAX`] keys are tracked. A full shard drops its idle cells at
//! most once per [`SWEEP_INTERVAL`]; a key that finds it still full is let through
//! untracked (counted): under a flood of distinct keys the limiter fails open rather
//! than grow, or spend its CPU sweeping.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, RandomState};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tracing::warn;

/// Keys tracked by one limiter: about 30 bytes each, so at most about 15 MB, and room for
/// every buyer of a large sale's busy minute.
pub const KEYS_MAX: usize = 500_000;
/// Shards of a limiter's map: concurrent purchases on many cores rarely wait on the same
/// lock.
const SHARDS: usize = 16;
/// Least time between two sweeps of one full shard: a sweep walks the whole shard.
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// A rate: `per_second` requests a second on average, `burst` of them at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    pub per_second: u32,
    pub burst: u32,
}

/// A refused request: how long until the same key would pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limited {
    pub retry_after: Duration,
}

pub struct Limiter<K> {
    shards: Box<[Mutex<Shard<K>>]>,
    hasher: RandomState,
    /// Nanoseconds between two requests at the steady rate.
    interval_ns: u64,
    /// How far ahead of now a cell's time may be for a request to pass.
    tolerance_ns: u64,
    keys_per_shard_max: usize,
    untracked: AtomicU64,
}

impl<K> std::fmt::Debug for Limiter<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limiter")
            .field("interval_ns", &self.interval_ns)
            .field("tolerance_ns", &self.tolerance_ns)
            .field("keys_per_shard_max", &self.keys_per_shard_max)
            .finish_non_exhaustive()
    }
}

struct Shard<K> {
    cells: HashMap<K, u64>,
    /// When this shard was last swept (the callers' clock, in nanoseconds), if ever.
    swept_at: Option<u64>,
}

impl<K: Hash + Eq + Copy> Limiter<K> {
    /// A limiter of `rate` (both figures at least 1), tracking at most `keys_max` keys.
    pub fn new(rate: Rate, keys_max: usize) -> Self {
        let per_second = u64::from(rate.per_second.max(1));
        let interval_ns = 1_000_000_000 / per_second;
        Limiter {
            shards: (0..SHARDS)
                .map(|_| {
                    Mutex::new(Shard {
                        cells: HashMap::new(),
                        swept_at: None,
                    })
                })
                .collect(),
            hasher: RandomState::new(),
            interval_ns,
            tolerance_ns: interval_ns * u64::from(rate.burst.max(1) - 1),
            keys_per_shard_max: keys_max.div_ceil(SHARDS).max(1),
            untracked: AtomicU64::new(0),
        }
    }

    /// Takes one request of `key` at `now`, a reading of the caller's monotonic clock (a
    /// time it reads anyway; every call of one limiter on the same clock).
    pub fn check(&self, key: K, now: Duration) -> Result<(), Limited> {
        self.check_at(key, u64::try_from(now.as_nanos()).unwrap_or(u64::MAX))
    }

    fn check_at(&self, key: K, now: u64) -> Result<(), Limited> {
        let shard_of = self.hasher.hash_one(key) as usize % SHARDS;
        let mut shard = lock(&self.shards[shard_of]);
        let full = shard.cells.len() >= self.keys_per_shard_max;
        match shard.cells.entry(key) {
            Entry::Occupied(mut cell) => {
                let tat = (*cell.get()).max(now);
                if tat - now > self.tolerance_ns {
                    return Err(Limited {
                        retry_after: Duration::from_nanos(tat - now - self.tolerance_ns),
                    });
                }
                cell.insert(tat.saturating_add(self.interval_ns));
            }
            // A new key passes: its cell starts full.
            Entry::Vacant(cell) if !full => {
                cell.insert(now.saturating_add(self.interval_ns));
            }
            Entry::Vacant(_) => {
                let sweep_due = shard
                    .swept_at
                    .is_none_or(|at| now.saturating_sub(at) >= SWEEP_INTERVAL.as_nanos() as u64);
                if sweep_due {
                    shard.cells.retain(|_, tat| *tat > now);
                    shard.swept_at = Some(now);
                    if shard.cells.len() >= self.keys_per_shard_max {
                        // At most once a sweep interval a shard: the operator learns the
                        // limit is failing open, the log is not flooded.
                        warn!(
                            keys_max = self.keys_per_shard_max * SHARDS,
                            untracked_so_far = self.untracked.load(Ordering::Relaxed),
                            "rate limiter full of busy keys: new keys pass untracked for now"
                        );
                    }
                }
                if shard.cells.len() >= self.keys_per_shard_max {
                    self.untracked.fetch_add(1, Ordering::Relaxed);
                } else {
                    shard
                        .cells
                        .insert(key, now.saturating_add(self.interval_ns));
                }
            }
        }
        Ok(())
    }

    /// Requests let through untracked because the limiter was full (since it was made).
    #[cfg(test)]
    fn untracked(&self) -> u64 {
        self.untracked.load(Ordering::Relaxed)
    }

    /// Keys tracked now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).cells.len()).sum()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every update of a shard is one insert or one retain: whatever panicked left it
    // consistent.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The key of a client address: an IPv4 address (an IPv4-mapped IPv6 one counts as
/// IPv4), or an IPv6 address's /64 network, the block one subscriber gets.
pub fn address_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & !u128::from(u64::MAX)).into()),
        },
    }
}

#[cfg(test)]
mod tests {
    // What: the GCRA cell's arithmetic (a burst passes at once, then one request per
    // interval; a refusal says how long to wait and changes nothing), keys apart from one
    // another, the bound on tracked keys (idle cells swept when room is needed, at most
    // once per interval; past the bound new keys pass untracked) and the address keys.
    // How: `check_at` with explicit times in nanoseconds, no clock.
    use super::*;

    const MS: u64 = 1_000_000;

    fn limiter(per_second: u32, burst: u32, keys_max: usize) -> Limiter<i64> {
        Limiter::new(Rate { per_second, burst }, keys_max)
    }

    #[test]
    fn a_burst_passes_then_one_request_per_interval() {
        let l = limiter(10, 3, 1000);
        let t = 5_000 * MS;
        for _ in 0..3 {
            assert_eq!(l.check_at(7, t), Ok(()));
        }
        // The fourth at once waits one interval (100 ms).
        assert_eq!(
            l.check_at(7, t),
            Err(Limited {
                retry_after: Duration::from_millis(100)
            })
        );
        // A refusal takes nothing: 40 ms later it is 60 ms.
        assert_eq!(
            l.check_at(7, t + 40 * MS),
            Err(Limited {
                retry_after: Duration::from_millis(60)
            })
        );
        assert_eq!(l.check_at(7, t + 100 * MS), Ok(()));
        assert!(l.check_at(7, t + 100 * MS).is_err());
        assert_eq!(l.check_at(7, t + 200 * MS), Ok(()));
        // Another key has its own burst.
        for _ in 0..3 {
            assert_eq!(l.check_at(8, t + 200 * MS), Ok(()));
        }
        assert!(l.check_at(8, t + 200 * MS).is_err());
        // Idle for longer than the burst takes to refill: a full burst again.
        for _ in 0..3 {
            assert_eq!(l.check_at(7, t + 2_000 * MS), Ok(()));
        }
        assert!(l.check_at(7, t + 2_000 * MS).is_err());
    }

    #[test]
    fn a_burst_of_one_spaces_every_request() {
        let l = limiter(2, 1, 1000);
        assert_eq!(l.check_at(1, 0), Ok(()));
        assert_eq!(
            l.check_at(1, 100 * MS),
            Err(Limited {
                retry_after: Duration::from_millis(400)
            })
        );
        assert_eq!(l.check_at(1, 500 * MS), Ok(()));
    }

    #[test]
    fn the_keys_tracked_are_bounded_and_idle_ones_make_room() {
        // Room for one key a shard.
        let l = limiter(1, 1, SHARDS);
        let t = 10_000 * MS;
        // Far more distinct keys than room, each busy once it passed (burst of one).
        for key in 0..1000 {
            assert_eq!(l.check_at(key, t), Ok(()), "a new key always passes");
        }
        assert_eq!(l.len(), SHARDS);
        assert_eq!(l.untracked(), 1000 - SHARDS as u64);
        // The tracked keys are limited; the others pass again (untracked).
        let limited = (0..1000).filter(|&k| l.check_at(k, t).is_err()).count();
        assert_eq!(limited, SHARDS);
        // A second on, every cell is idle: a new key's sweep makes room, and the new key
        // is tracked (its second request at once is refused).
        let later = t + 1_001 * MS;
        for key in 5_000..6_000 {
            assert_eq!(l.check_at(key, later), Ok(()));
        }
        let limited = (5_000..6_000)
            .filter(|&k| l.check_at(k, later).is_err())
            .count();
        assert_eq!(limited, SHARDS, "each shard swept once and took a new key");
    }

    #[test]
    fn a_full_shard_is_swept_at_most_once_per_interval() {
        // Room for one key a shard; each tracked key's whole burst (5 s worth at 1/s)
        // used at time 0, so its cell stays busy until 5 s.
        let l = limiter(1, 5, SHARDS);
        for key in 0..1000 {
            for _ in 0..5 {
                assert_eq!(l.check_at(key, 0), Ok(()));
            }
        }
        assert_eq!(l.len(), SHARDS);
        let untracked_between = |from: i64, at_ms: u64| {
            let before = l.untracked();
            for key in from..from + 1000 {
                assert_eq!(l.check_at(key, at_ms * MS), Ok(()));
            }
            l.untracked() - before
        };
        // 4.5 s: a sweep is due, but every cell is still busy: no room.
        assert_eq!(untracked_between(100_000, 4_500), 1000);
        // 5.2 s: every cell is idle, but the shards were swept 0.7 s ago: no sweep, so
        // still no room.
        assert_eq!(untracked_between(200_000, 5_200), 1000);
        // 5.6 s: a sweep is due again and makes room, one new key a shard.
        assert_eq!(untracked_between(300_000, 5_600), 1000 - SHARDS as u64);
    }

    #[test]
    fn addresses_key_by_host_or_ipv6_network() {
        let v4: IpAddr = "203.0.113.9".parse().unwrap();
        assert_eq!(address_key(v4), v4);
        let mapped: IpAddr = "::ffff:203.0.113.9".parse().unwrap();
        assert_eq!(address_key(mapped), v4);
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:bbbb::2".parse().unwrap();
        let c: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(address_key(a), address_key(b));
        assert_ne!(address_key(a), address_key(c));
        assert_eq!(address_key(a), "2001:db8:1:2::".parse::<IpAddr>().unwrap());
    }
}
