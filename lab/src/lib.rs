//! quicsdn-lab
