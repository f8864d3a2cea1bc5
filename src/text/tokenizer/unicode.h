#pragma once
// UTF-8 handling for the tokenizer: validation, lossy decoding (U+FFFD like Hugging Face),
// NFC normalization (utf8proc) and the GPT-2 byte-level alphabet.
#include <array>
#include <cstddef>
#include <string>
#include <string_view>

namespace ellm::unicode {

inline constexpr size_t kValid = std::string_view::npos;

// Byte offset of the first ill-formed UTF-8 sequence in `s`, or kValid.
size_t find_invalid_utf8(std::string_view s);

// Appends `bytes` to `out` as UTF-8, replacing each maximal ill-formed subpart with U+FFFD
// (the Unicode "substitution of maximal subparts" practice that Python's errors='replace',
// Rust's from_utf8_lossy and WHATWG TextDecoder all follow). With `final` false, a trailing
// sequence that is still a valid prefix of a character is left unconsumed. Returns the number
// of bytes consumed, so streaming calls concatenate to exactly the one-shot result.
size_t append_utf8_lossy(std::string_view bytes, bool final, std::string& out);

// Code point of a valid UTF-8 sequence at s[0..]; sets `length` to its byte count.
char32_t decode_utf8(std::string_view s, int& length);
void append_utf8(char32_t cp, std::string& out);

// NFC form of valid UTF-8 text. Returns false (and leaves `out` untouched) when the text is
// already NFC by a cheap check, so the common ASCII case costs one scan.
bool nfc(std::string_view text, std::string& out);

// GPT-2 byte-level BPE alphabet: every byte maps to a printable code point (printable Latin-1
// bytes to themselves, the rest to U+0100 onwards), so token strings in tokenizer.json are text.
const std::array<char32_t, 256>& byte_to_codepoint();
// Inverse of byte_to_codepoint(): the byte for `cp`, or -1 if `cp` is not in the alphabet.
int codepoint_to_byte(char32_t cp);

}  // namespace ellm::unicode
