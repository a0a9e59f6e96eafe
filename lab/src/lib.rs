//! quicsdn-lab: a one-command emulated SDN testbed.

pub mod emulator;
