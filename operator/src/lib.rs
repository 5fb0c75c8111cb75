//! waycast's operator. So far its pure core: [`compile`] turns a Gateway
//! and the objects it selects into the config its pods serve and a verdict
//! for each object. The controllers that feed it and apply its output are
//! still to be built.

pub mod compile;
pub mod render;
