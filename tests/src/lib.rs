//! Helpers shared by the integration tests (the mesh factory lands with the end-to-end work).
