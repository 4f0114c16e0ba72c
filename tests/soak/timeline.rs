//! The time line of a run: what happened when (for the report around a violation, and, but
//! for the writer's changes, at the end of every run), the spans during which a fault's
//! effects last (when the bounds that hold while all is well are not checked), and counts by
//! kind.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A fault's span: from when it began until its effects are over (`None` while it lasts).
struct Span {
    from: Instant,
    to: Option<Instant>,
    fault: &'static str,
}

pub struct Timeline {
    start: Instant,
    /// Each event, and whether it is one of the writer's changes (left out of [`log`](Self::log)).
    events: Mutex<Vec<(Instant, String, bool)>>,
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
        self.events
            .lock()
            .unwrap()
            .push((Instant::now(), text, false));
    }

    /// A change made by the writer: one of many, shown only around a violation.
    pub fn change(&self, text: String) {
        self.events
            .lock()
            .unwrap()
            .push((Instant::now(), text, true));
    }

    pub fn count(&self, what: &'static str) {
        *self.counts.lock().unwrap().entry(what).or_default() += 1;
    }

    /// Records that `fault` began at `from`: its span is open until [`end`](Self::end)
    /// closes it, so that the checks made while it lasts see it. Returns the span's index.
    pub fn begin(&self, fault: &'static str, from: Instant) -> usize {
        let mut spans = self.spans.lock().unwrap();
        spans.push(Span {
            from,
            to: None,
            fault,
        });
        spans.len() - 1
    }

    /// Records that the effects of the fault of span `index` last until `to`.
    pub fn end(&self, index: usize, to: Instant) {
        self.spans.lock().unwrap()[index].to = Some(to);
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
            .any(|span| span.from <= to && span.to.is_none_or(|end| from <= end) && which(span))
    }

    pub fn since_start(&self, at: Instant) -> f64 {
        at.saturating_duration_since(self.start).as_secs_f64()
    }

    /// The events within `around` of `at`, one per line.
    pub fn around(&self, at: Instant, around: Duration) -> String {
        self.lines(|when, _| {
            when.saturating_duration_since(at) <= around
                && at.saturating_duration_since(when) <= around
        })
    }

    /// Every event but the writer's changes, one per line: the faults and what they did.
    pub fn log(&self) -> String {
        self.lines(|_, change| !change)
    }

    fn lines(&self, which: impl Fn(Instant, bool) -> bool) -> String {
        let events = self.events.lock().unwrap();
        events
            .iter()
            .filter(|(when, _, change)| which(*when, *change))
            .map(|(when, text, _)| format!("    {:8.3}s {text}\n", self.since_start(*when)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fault in progress (begun, not ended: a failover that takes seconds) makes the time
    /// unhealthy for the checks made meanwhile, not only once it has ended.
    #[test]
    fn a_fault_in_progress_is_unhealthy() {
        let start = Instant::now();
        let timeline = Timeline::new(start);
        let span = timeline.begin("master-killed", start);
        let later = start + Duration::from_secs(2);
        assert!(timeline.unhealthy_during(later, later));
        assert!(timeline.fault_during("master-killed", later, later));
        assert!(!timeline.other_fault_during(start, later, later));
        timeline.end(span, start + Duration::from_secs(5));
        let after = start + Duration::from_secs(6);
        assert!(timeline.unhealthy_during(later, later));
        assert!(!timeline.unhealthy_during(after, after));
    }
}
