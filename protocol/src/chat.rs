//! ChatML rendering of prompts.
//!
//! llama.cpp's template support does not execute the GGUF's Jinja template,
//! and SmolLM2's template inserts a default system prompt when none is given
//! (`llamacpp.md` §4). To make miner, validator and trainer agree byte for
//! byte, the protocol renders ChatML itself and every environment passes an
//! explicit system prompt.

/// Start-of-turn marker (token id 1 in SmolLM2).
pub const IM_START: &str = "<|im_start|>";
/// End-of-turn marker (token id 2, SmolLM2's EOS).
pub const IM_END: &str = "<|im_end|>";

/// `<|im_start|>system\n{system}<|im_end|>\n` (if any), then
/// `<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n`.
/// Tokenize the result with special tokens parsed.
pub fn chatml_prompt(system: Option<&str>, user: &str) -> String {
    let mut s = String::with_capacity(user.len() + system.map_or(0, str::len) + 64);
    if let Some(sys) = system {
        push_turn(&mut s, "system", sys);
    }
    push_turn(&mut s, "user", user);
    s.push_str(IM_START);
    s.push_str("assistant\n");
    s
}

/// [`chatml_prompt`] with worked examples before the question: after the
/// system turn, each `(user, assistant)` pair as a user turn and an
/// assistant turn, then the user turn and the open assistant turn.
pub fn chatml_prompt_with_examples(system: Option<&str>, examples: &[(String, String)], user: &str) -> String {
    let mut s = String::new();
    if let Some(sys) = system {
        push_turn(&mut s, "system", sys);
    }
    for (question, answer) in examples {
        push_turn(&mut s, "user", question);
        push_turn(&mut s, "assistant", answer);
    }
    push_turn(&mut s, "user", user);
    s.push_str(IM_START);
    s.push_str("assistant\n");
    s
}

fn push_turn(s: &mut String, role: &str, content: &str) {
    s.push_str(IM_START);
    s.push_str(role);
    s.push('\n');
    s.push_str(content);
    s.push_str(IM_END);
    s.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_chatml() {
        assert_eq!(chatml_prompt(None, "Hello!"), "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n");
        assert_eq!(
            chatml_prompt(Some("Be brief."), "2+2?"),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
        );
    }
}
