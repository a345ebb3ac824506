// The chat page served at / (src/server/chat_page.html, compiled in by CMake).
#pragma once

namespace kiln::server {

// The whole self-contained HTML page.
const char* chat_page_html();

}  // namespace kiln::server
