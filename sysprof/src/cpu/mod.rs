//! The on-CPU family: sampling every CPU at a frequency, the profile of where the target ran,
//! its hotspots and what they recommend.

pub mod hotspots;
pub mod probes;
pub mod recommend;

pub(crate) use self::probes::CpuFamily;
pub use self::{
    hotspots::{Hotspot, ProcessShare, hotspots, process_shares},
    probes::CpuSamples,
    recommend::cpu_recommendations,
};
