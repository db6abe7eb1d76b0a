//! Unit tests on hand-built images.
