//! Harness for running tender-hub in-process in end-to-end tests.
