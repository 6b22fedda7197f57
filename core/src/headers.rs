//! header parsing
