//! The open-loop timeline: attempt `k` is due at `k / rate` seconds after the start,
//! whatever the server does. Latency is measured from that intended time, so a server that
//! stalls cannot hide the wait of the requests that should have been sent meanwhile
//! (coordinated omission).

use std::time::Duration;

/// A fixed-rate schedule of `attempts` sends.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Schedule {
    /// Attempts per second (> 0).
    rate: f64,
    /// How many attempts the schedule holds.
    attempts: u64,
}

impl Schedule {
    /// A schedule of `attempts` sends at `rate` per second; `None` if the rate is not a
    /// positive finite number.
    pub fn new(rate: f64, attempts: u64) -> Option<Self> {
        (rate.is_finite() && rate > 0.0).then_some(Self { rate, attempts })
    }

    /// When attempt `k` should be sent, as an offset from the start.
    pub fn intended(&self, k: u64) -> Duration {
        Duration::from_secs_f64(k as f64 / self.rate)
    }

    /// How many attempts are due `elapsed` after the start (those with
    /// `intended(k) <= elapsed`), at most the schedule's length.
    pub fn due_by(&self, elapsed: Duration) -> u64 {
        if self.attempts == 0 {
            return 0;
        }
        // A first guess by arithmetic, then corrected against intended() itself so the two
        // never disagree at a boundary by a rounding step. Each loop moves the guess one
        // attempt and floating-point error is far below one attempt, so they run at most a
        // couple of times.
        let guess = (elapsed.as_secs_f64() * self.rate).floor();
        let last = self.attempts - 1;
        let mut k = if guess >= last as f64 {
            last
        } else {
            guess as u64
        };
        while k > 0 && self.intended(k) > elapsed {
            k -= 1;
        }
        while k < last && self.intended(k + 1) <= elapsed {
            k += 1;
        }
        // Attempt 0 is due at once, so at least one attempt is due.
        k + 1
    }

    /// The schedule's length.
    pub fn attempts(&self) -> u64 {
        self.attempts
    }

    /// How long the whole schedule takes to dispatch (the last attempt's intended time).
    pub fn span(&self) -> Duration {
        self.intended(self.attempts.saturating_sub(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the timeline itself: at 1,000/s attempt k is due at k ms, whatever k, and
    // the span is the last attempt's time; by computing intended() for a few k.
    #[test]
    fn intended_times_are_evenly_spaced() {
        let s = Schedule::new(1000.0, 5000).expect("valid");
        assert_eq!(s.intended(0), Duration::ZERO);
        assert_eq!(s.intended(1), Duration::from_millis(1));
        assert_eq!(s.intended(2500), Duration::from_millis(2500));
        assert_eq!(s.span(), Duration::from_millis(4999));
        let fast = Schedule::new(200_000.0, 10).expect("valid");
        assert_eq!(fast.intended(3), Duration::from_micros(15));
    }

    // Checks due_by() agrees with intended(): for many instants, every attempt counted as
    // due has an intended time at or before the instant and the next one is after it;
    // and the count never exceeds the schedule's length.
    #[test]
    fn due_by_matches_intended_times() {
        let s = Schedule::new(333.0, 1000).expect("valid");
        for ms in (0..4000).step_by(7) {
            let t = Duration::from_millis(ms);
            let due = s.due_by(t);
            assert!(due <= s.attempts());
            if due > 0 {
                assert!(s.intended(due - 1) <= t, "attempt {} due at {t:?}", due - 1);
            }
            if due < s.attempts() {
                assert!(s.intended(due) > t, "attempt {due} not yet due at {t:?}");
            }
        }
        assert_eq!(s.due_by(Duration::from_secs(3600)), 1000);
        assert_eq!(s.due_by(Duration::ZERO), 1);
    }

    // Checks that rates which can't define a timeline are refused: zero, negative, NaN,
    // infinite.
    #[test]
    fn refuses_meaningless_rates() {
        for rate in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert!(Schedule::new(rate, 10).is_none(), "{rate}");
        }
        let empty = Schedule::new(10.0, 0).expect("valid");
        assert_eq!(empty.due_by(Duration::from_secs(5)), 0);
    }
}
