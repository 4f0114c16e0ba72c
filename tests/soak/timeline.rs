//! The time line of a run: what happened when (for the report around a violation), the spans
//! during which a fault's effects last (when the bounds that hold while all is well are not
//! checked), and counts by kind.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A fault's span: from when it began until its effects are over.
struct Span {
    from: Instant,
    to: Instant,
    fault: &'static str,
}

pub struct Timeline {
    start: Instant,
    events: Mutex<Vec<(Instant, String)>>,
    spans: Mutex<Vec<Span>>,
    pub counts: Mutex<std::collections::BTreeMap<&'static str, usize>>,
}

impl Timeline {
    pub fn new(start: Instant) -> Self {
        Timeline {
            start,
            events: Mutex::default(),
            spans: Mutex::default(),
            counts: Mutex::default(),
        }
    }

    pub fn event(&self, text: String) {
        self.events.lock().unwrap().push((Instant::now(), text));
    }

    pub fn count(&self, what: &'static str) {
        *self.counts.lock().unwrap().entry(what).or_default() += 1;
    }

    /// Records that `fault`'s effects last from `from` until `to`.
    pub fn span(&self, fault: &'static str, from: Instant, to: Instant) {
        self.spans.lock().unwrap().push(Span { from, to, fault });
    }

    /// Whether any fault's span overlaps `from..to`.
    pub fn unhealthy_during(&self, from: Instant, to: Instant) -> bool {
        self.spans_during(from, to, |_| true)
    }

    /// Whether a span of another fault than the one that began at `began` overlaps `from..to`.
    pub fn other_fault_during(&self, began: Instant, from: Instant, to: Instant) -> bool {
        self.spans_during(from, to, |span| span.from != began)
    }

    /// Whether a span of `fault` overlaps `from..to`.
    pub fn fault_during(&self, fault: &str, from: Instant, to: Instant) -> bool {
        self.spans_during(from, to, |span| span.fault == fault)
    }

    fn spans_during(&self, from: Instant, to: Instant, which: impl Fn(&Span) -> bool) -> bool {
        self.spans
            .lock()
            .unwrap()
            .iter()
            .any(|span| span.from <= to && from <= span.to && which(span))
    }

    pub fn since_start(&self, at: Instant) -> f64 {
        at.saturating_duration_since(self.start).as_secs_f64()
    }

    /// The events within `around` of `at`, one per line.
    pub fn around(&self, at: Instant, around: Duration) -> String {
        let events = self.events.lock().unwrap();
        events
            .iter()
            .filter(|(when, _)| {
                when.saturating_duration_since(at) <= around
                    && at.saturating_duration_since(*when) <= around
            })
            .map(|(when, text)| format!("    {:8.3}s {text}\n", self.since_start(*when)))
            .collect()
    }
}
