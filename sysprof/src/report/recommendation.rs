//! One recommendation, the unit every family's analysis hands the ranking (a leaf, so that the
//! families depend on it and not on the whole report model), and the ranking itself: every
//! family estimates the seconds of the target's time a change could win back, one scale for
//! all of them.

use serde::Serialize;

/// One recommendation: what it could win back, the figure behind it, and what to do.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Recommendation {
    /// Seconds of the target's time the change could win back: the ranking key.
    pub seconds: f64,
    /// `seconds` as a share of the target's time (`RunSummary::target_time_s`), 0 to 1; set by
    /// [`rank`].
    pub impact: f64,
    pub title: String,
    /// The measured figure that supports it.
    pub evidence: String,
    pub action: String,
}

impl Recommendation {
    pub fn new(
        seconds: f64,
        title: impl Into<String>,
        evidence: impl Into<String>,
        action: impl Into<String>,
    ) -> Self {
        Recommendation {
            seconds: if seconds.is_finite() { seconds.max(0.0) } else { 0.0 },
            impact: 0.0,
            title: title.into(),
            evidence: evidence.into(),
            action: action.into(),
        }
    }
}

/// Below this share of the target's time a change is not worth a line: the report says that
/// nothing stands out rather than list it.
pub const WORTH_A_LINE: f64 = 0.02;

/// The recommendations worth a line, largest win first: each with its share of `target_s`
/// (capped: no change wins back more than the target's time), one per title (the largest).
pub fn rank(mut recommendations: Vec<Recommendation>, target_s: f64) -> Vec<Recommendation> {
    let target_s = target_s.max(1e-3);
    for recommendation in &mut recommendations {
        recommendation.seconds = recommendation.seconds.min(target_s);
        recommendation.impact = recommendation.seconds / target_s;
    }
    recommendations.retain(|r| r.impact >= WORTH_A_LINE);
    // Stable: equal wins keep the families' order.
    recommendations.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
    let mut seen = std::collections::HashSet::new();
    recommendations.retain(|r| seen.insert(r.title.clone()));
    recommendations
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranked_by_seconds_one_per_title_small_ones_left_out() {
        let rec = |seconds: f64, title: &str| Recommendation::new(seconds, title, "", "");
        let ranked =
            rank(vec![rec(0.5, "a"), rec(2.0, "b"), rec(0.9, "a"), rec(0.01, "c"), rec(9.0, "d")], 4.0);
        let titles: Vec<&str> = ranked.iter().map(|r| r.title.as_str()).collect();
        assert_eq!(titles, ["d", "b", "a"]);
        assert_eq!(ranked[0].seconds, 4.0, "capped at the target's time");
        assert_eq!(ranked[0].impact, 1.0);
        assert_eq!(ranked[2].seconds, 0.9, "the larger of two with one title");
        assert_eq!(ranked[1].impact, 0.5);
    }
}
