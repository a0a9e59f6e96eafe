//! quicsdn-lab
pub mod bench;
