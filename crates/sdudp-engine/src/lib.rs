//! The thin driver of SDUDP's engines ([`quicsdn_sdudp`]): raw frames from a
//! switch port in, the sans-IO engine's output out.

pub mod edge;
pub mod frame;
pub mod packet;
pub mod relay;
pub mod tcp;
