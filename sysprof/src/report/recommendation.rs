//! One recommendation, the unit every family's analysis hands the ranking: a leaf, so that the
//! families depend on it and not on the whole report model.

use serde::Serialize;

/// One recommendation: the figure behind it and what to do.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Recommendation {
    /// Share of the measured time the change could win back (0 to 1): the ranking key.
    pub impact: f64,
    pub title: String,
    /// The measured figure that supports it.
    pub evidence: String,
    pub action: String,
}
