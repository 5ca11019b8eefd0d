"""The drafting library: what more than one method drafts with (n-gram search, suffix trees and automata,
REST's datastore, draft-head checkpoints and choices trees, Token Recycling's matrix). Methods import
these pieces, never one another; nothing here registers a method."""
