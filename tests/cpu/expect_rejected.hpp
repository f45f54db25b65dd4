// The validation suites' check that a call is refused with a message that starts with the
// argument's name and holds each expected phrase. A suite defines, for its Call type,
// std::optional<std::string> error_of(const Call&) (the message of the Error its call throws,
// or nothing), found by argument-dependent lookup.
#pragma once
#include <initializer_list>
#include <optional>
#include <string>

#include "harness.hpp"

template <class Call>
void expect_rejected(const Call& c, const std::string& argument, std::initializer_list<const char*> expected, int line) {
  const std::optional<std::string> message = error_of(c);
  if (!message) {
    // With the phrases, which tell apart the rules of a table checked from one line.
    std::string phrases;
    for (const char* text : expected) phrases += std::string(" \"") + text + "\"";
    CHECK(false) << "line " << line << ": accepted, expected an error about " << argument << phrases;
    return;
  }
  CHECK(message->rfind(argument + ": ", 0) == 0) << "line " << line << ": should name " << argument << ": " << *message;
  for (const char* text : expected)
    CHECK(message->find(text) != std::string::npos) << "line " << line << ": missing \"" << text << "\" in: " << *message;
}
#define EXPECT_REJECTED(call, argument, ...) expect_rejected(call, argument, {__VA_ARGS__}, __LINE__)
