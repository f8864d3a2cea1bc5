// Drives ellm serve's Messages API with the official `@anthropic-ai/sdk` client. Usage:
//   node anthropic_client.mjs BASE_URL KEY basic   create and stream (events add up to the final
//                                                  message), count_tokens, a forced tool call
//   node anthropic_client.mjs BASE_URL KEY tools   scripted reasoning and tool call, streamed;
//                                                  the round trip with its cache, stop sequences
//   node anthropic_client.mjs BASE_URL KEY bad     bad input: a 4xx in Anthropic's error shape
//                                                  each, while a good stream runs unharmed
// Prints "ok" and exits 0 when every check passes; otherwise prints the failure and exits 1.
import Anthropic from "@anthropic-ai/sdk";

const [baseURL, apiKey, mode] = process.argv.slice(2);
const client = new Anthropic({ baseURL, apiKey, maxRetries: 0 });
const model = "claude-any-name";  // the server answers every name with its model

function check(cond, what) {
  if (!cond) {
    console.error("FAIL: " + what);
    process.exit(1);
  }
}

const tools = [{
  name: "get_weather",
  description: "Get the current weather for a city.",
  input_schema: { type: "object", properties: { city: { type: "string", maxLength: 12 } }, required: ["city"] },
}];

// JSON with sorted keys: the same value however its fields were ordered.
const canon = (v) => JSON.stringify(v, (k, x) => (x && typeof x === "object" && !Array.isArray(x)
  ? Object.fromEntries(Object.entries(x).sort(([a], [b]) => (a < b ? -1 : 1))) : x));

// Streams a request and rebuilds the message from the raw events themselves, checking their
// order; returns it beside the SDK's own final message and the event types seen.
async function streamed(params) {
  const stream = client.messages.stream(params);
  const types = [];
  let message = null, open = -1;
  const json = {};
  for await (const event of stream) {
    types.push(event.type === "content_block_delta" ? event.delta.type : event.type);
    switch (event.type) {
      case "message_start":
        check(message === null && types.length === 1, "message_start comes first, once");
        message = structuredClone(event.message);
        break;
      case "content_block_start":
        check(open === -1 && event.index === message.content.length, `block ${event.index} starts in order`);
        message.content.push(structuredClone(event.content_block));
        open = event.index;
        json[open] = "";
        break;
      case "content_block_delta": {
        check(event.index === open, "deltas go to the open block");
        const block = message.content[open], d = event.delta;
        if (d.type === "text_delta") block.text += d.text;
        else if (d.type === "thinking_delta") block.thinking += d.thinking;
        else if (d.type === "signature_delta") block.signature = d.signature;
        else if (d.type === "input_json_delta") json[open] += d.partial_json;
        else check(false, `unknown delta ${d.type}`);
        break;
      }
      case "content_block_stop":
        check(event.index === open, "the open block stops");
        if (message.content[open].type === "tool_use") message.content[open].input = JSON.parse(json[open] || "{}");
        open = -1;
        break;
      case "message_delta":
        check(open === -1, "message_delta after the last block stopped");
        message.stop_reason = event.delta.stop_reason;
        message.stop_sequence = event.delta.stop_sequence;
        message.usage = { ...message.usage, ...event.usage };
        break;
      case "message_stop":
        break;
      default:
        check(false, `unknown event ${event.type}`);
    }
  }
  check(types.at(-1) === "message_stop", "message_stop comes last");
  const final = await stream.finalMessage();
  check(canon(final.content) === canon(message.content),
        `the deltas add up to the final message: ${JSON.stringify(message.content)} vs ${JSON.stringify(final.content)}`);
  check(final.stop_reason === message.stop_reason && final.usage.output_tokens === message.usage.output_tokens,
        "stop_reason and usage of the final message");
  return { message, final, types };
}

async function basic() {
  const messages = [{ role: "user", content: "Hello!" }];
  const params = { model, max_tokens: 6, temperature: 0, messages, thinking: { type: "disabled" } };
  const whole = await client.messages.create(params);
  check(whole.type === "message" && whole.role === "assistant" && whole.id.startsWith("msg_"), "message fields");
  check(whole.stop_reason === "max_tokens" && whole.usage.output_tokens === 6, `stop_reason ${whole.stop_reason}`);
  check(whole.content.length === 1 && whole.content[0].type === "text", `content ${JSON.stringify(whole.content)}`);
  const { final } = await streamed(params);
  check(final.content[0].text === whole.content[0].text, "the stream says what the whole reply said");
  check(final.usage.cache_read_input_tokens > 0 &&
        final.usage.input_tokens + final.usage.cache_read_input_tokens === whole.usage.input_tokens,
        `the repeated prompt is served from the cache: ${JSON.stringify(final.usage)}`);

  const count = await client.messages.countTokens({ model, messages, thinking: { type: "disabled" } });
  check(count.input_tokens === whole.usage.input_tokens + whole.usage.cache_read_input_tokens,
        `count_tokens ${count.input_tokens} is the prompt's length`);

  // A forced tool call on random weights: the grammar makes it a call whose input fits.
  const forced = await client.messages.create({
    model, max_tokens: 80, temperature: 1, messages, tools, tool_choice: { type: "tool", name: "get_weather" },
    thinking: { type: "disabled" },
  });
  const use = forced.content.find((b) => b.type === "tool_use");
  check(forced.stop_reason === "tool_use" && use?.name === "get_weather" && typeof use.input.city === "string",
        `forced call ${JSON.stringify(forced.content)}`);
  const { final: forcedStream } = await streamed({
    model, max_tokens: 80, temperature: 1, messages, tools, tool_choice: { type: "any" }, thinking: { type: "disabled" },
  });
  check(forcedStream.stop_reason === "tool_use" && forcedStream.content.some((b) => b.type === "tool_use"),
        `tool_choice any ${JSON.stringify(forcedStream.content)}`);
}

async function tools_round_trip() {
  const messages = [{ role: "user", content: "What is the weather in Paris?" }];
  const system = [{ type: "text", text: "x-anthropic-billing-header: nonce=" + Math.random() + ";" },
                  { type: "text", text: "You are a weather bot." }];
  const { final: first, types } = await streamed({ model, max_tokens: 200, system, messages, tools,
                                                   thinking: { type: "enabled", budget_tokens: 100 } });
  check(first.stop_reason === "tool_use", `first stop_reason ${first.stop_reason}`);
  check(first.content.map((b) => b.type).join() === "thinking,tool_use", `blocks ${JSON.stringify(first.content)}`);
  check(first.content[0].thinking === "I should look it up." && first.content[0].signature.length > 0, "thinking");
  check(types.indexOf("signature_delta") > types.lastIndexOf("thinking_delta"), "signature_delta after the thinking");
  check(types.filter((t) => t === "input_json_delta").length > 1, `the input streams in pieces: ${types}`);
  const call = first.content[1];
  check(call.name === "get_weather" && call.input.city === "Paris" && call.id, `call ${JSON.stringify(call)}`);

  // The result goes back (a new nonce in the system prompt changes nothing: it is dropped).
  system[0].text = "x-anthropic-billing-header: nonce=" + Math.random() + ";";
  const followUp = [...messages, { role: "assistant", content: first.content },
                    { role: "user", content: [{ type: "tool_result", tool_use_id: call.id, content: "21 C, sunny" }] }];
  const answer = await client.messages.create({ model, max_tokens: 200, system, messages: followUp, tools,
                                                thinking: { type: "enabled", budget_tokens: 100 } });
  const firstPrompt = first.usage.input_tokens + first.usage.cache_read_input_tokens;
  check(answer.stop_reason === "end_turn" && answer.content.at(-1).text === "Sunny, 21 C. END of report",
        `answer ${JSON.stringify(answer.content)}`);
  check(answer.usage.cache_read_input_tokens >= 0.95 * firstPrompt,
        `the follow-up is served from the cache: ${JSON.stringify(answer.usage)} after a prompt of ${firstPrompt}`);
  const count = await client.messages.countTokens({ model, system, messages: followUp, tools,
                                                    thinking: { type: "enabled", budget_tokens: 100 } });
  check(count.input_tokens === answer.usage.input_tokens + answer.usage.cache_read_input_tokens,
        `count_tokens ${count.input_tokens} against the follow-up's usage ${JSON.stringify(answer.usage)}`);

  const stopped = await client.messages.create({ model, max_tokens: 200, system, messages: followUp, tools,
                                                 stop_sequences: ["END"], thinking: { type: "enabled", budget_tokens: 100 } });
  check(stopped.stop_reason === "stop_sequence" && stopped.stop_sequence === "END" &&
        stopped.content.at(-1).text === "Sunny, 21 C. ", `stop sequence ${JSON.stringify(stopped)}`);
}

async function expectError(params, status, pattern) {
  try {
    await client.messages.create(params);
  } catch (e) {
    check(e.status === status && e.error?.type === "error" && e.error.error?.type === "invalid_request_error" &&
          pattern.test(e.error.error.message), `${pattern}: ${e.status} ${JSON.stringify(e.error)}`);
    return;
  }
  check(false, `accepted: ${JSON.stringify(params).slice(0, 200)}`);
}

async function bad() {
  const messages = [{ role: "user", content: "Hello!" }];
  // A good stream runs while the bad requests are refused.
  const good = streamed({ model, max_tokens: 40, temperature: 0, messages, thinking: { type: "disabled" } });
  await expectError({ model, max_tokens: 5, messages: [{ role: "user", content: [{ type: "text" }] }] }, 400,
                    /messages\[0\]\.content\[0\]: a text block needs a string 'text'/);
  await expectError({ model, max_tokens: 5, messages: [{ role: "user", content: [{ type: "image", source: { type: "base64", media_type: "image/png", data: "iVBORw0KGgo=" } }] }] },
                    400, /takes text only/);
  await expectError({ model, max_tokens: 5, messages, tools: [{ type: "frobnicate_2030", name: "f" }] }, 400,
                    /unknown tool type 'frobnicate_2030'/);
  await expectError({ model, max_tokens: 5, messages: [{ role: "user", content: [{ type: "tool_result", tool_use_id: "toolu_x", content: "1" }] }] },
                    400, /tool_result 'toolu_x' answers no tool_use/);
  // Anthropic's own tools carry no schema: left out, the request is served.
  const served = await client.messages.create({ model, max_tokens: 3, messages, thinking: { type: "disabled" },
                                                tools: [{ type: "web_search_20250305", name: "web_search", max_uses: 2 }] });
  check(served.stop_reason === "max_tokens", "a server tool is skipped");
  const { final } = await good;
  check(final.stop_reason === "max_tokens" && final.usage.output_tokens === 40, `the good stream: ${JSON.stringify(final)}`);
}

try {
  if (mode === "basic") await basic();
  else if (mode === "tools") await tools_round_trip();
  else if (mode === "bad") await bad();
  else check(false, "unknown mode " + mode);
  console.log("ok");
} catch (e) {
  console.error("FAIL: " + (e.stack || e));
  process.exit(1);
}
