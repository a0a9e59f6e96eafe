//! quicsdn-agent
