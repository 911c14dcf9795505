//! Bounds on text that a user can make long and that services pass on.

use std::borrow::Cow;

/// The most bytes of a reason (a decode error, a refusal) that a service
/// passes on: reasons go into dead letters' headers, events and the
/// history, where a user's 200,000-character field name, quoted whole by a
/// decode error, would be over the broker's frame size or crowd out
/// everyone else's entries.
pub const REASON_BYTES: usize = 1024;

/// `text` cut to [`REASON_BYTES`] at a character boundary, saying how much
/// was left out.
pub fn cut_reason(text: &str) -> Cow<'_, str> {
    cut(text, REASON_BYTES)
}

/// `text` cut to at most `max` bytes (and the note) at a character boundary.
pub fn cut(text: &str, max: usize) -> Cow<'_, str> {
    if text.len() <= max {
        return Cow::Borrowed(text);
    }
    let note = format!("… ({} bytes more)", text.len());
    let mut end = max.saturating_sub(note.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!(
        "{}… ({} bytes more)",
        &text[..end],
        text.len() - end
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_text_is_cut_at_a_character_boundary_within_the_bound() {
        assert_eq!(cut_reason("short"), "short");
        let long = format!("unknown field `{}`", "é".repeat(100_000));
        let cut = cut_reason(&long);
        assert!(cut.len() <= REASON_BYTES, "{}", cut.len());
        assert!(cut.starts_with("unknown field `éé"));
        assert!(cut.ends_with(" bytes more)"), "{cut}");
        let exact = "x".repeat(REASON_BYTES);
        assert_eq!(cut_reason(&exact), exact.as_str());
    }
}
