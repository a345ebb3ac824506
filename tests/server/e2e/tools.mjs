// The two functions the tool-calling tests offer the demo model (OpenAI's form; the
// Anthropic tests convert them with anthropicTools).
export const tools = [
  {
    type: "function",
    function: {
      name: "get_weather",
      description: "The weather in a city",
      parameters: { type: "object", properties: { city: { type: "string", maxLength: 20 },
                                                  unit: { enum: ["celsius", "fahrenheit"] } },
                    required: ["city"], additionalProperties: false },
    },
  },
  {
    type: "function",
    function: {
      name: "add", strict: true,
      parameters: { type: "object", properties: { a: { type: "integer" }, b: { type: "integer" } },
                    required: ["a", "b"], additionalProperties: false },
    },
  },
];

export const anthropicTools = tools.map((t) => ({ name: t.function.name, description: t.function.description ?? "",
                                                  input_schema: t.function.parameters }));
