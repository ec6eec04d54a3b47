//! Harness for running tender-agent in-process in end-to-end tests.
